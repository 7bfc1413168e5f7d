"""Reads a fulgur checkpoint as a careful Python user would (torch.load, weights_only=True, the
default since torch 2.6), checks what it holds, and writes it back with torch.save for fulgur to read.

usage: python_roundtrip.py <fulgur checkpoint> <output .pt>
"""
import sys

import torch

source, target = sys.argv[1], sys.argv[2]
checkpoint = torch.load(source, weights_only=True, map_location="cpu")
assert isinstance(checkpoint, dict), type(checkpoint)
for key in ("epoch", "global_step", "pytorch-lightning_version", "state_dict", "optimizer_states", "lr_schedulers",
            "loops", "callbacks", "fulgur"):
    assert key in checkpoint, f"missing {key}: {sorted(checkpoint)}"
state = checkpoint["state_dict"]
assert all(isinstance(v, torch.Tensor) for v in state.values()), {k: type(v) for k, v in state.items()}
assert state["fc1.weight"].shape == (16, 8) and state["fc1.weight"].dtype == torch.float32
assert checkpoint["fulgur"]["format_version"] >= 1
if "MixedPrecision" in checkpoint:
    assert isinstance(checkpoint["MixedPrecision"]["scale"], float)  # as GradScaler.state_dict() has it
torch.save({"state_dict": state, "global_step": checkpoint["global_step"]}, target)
print(f"python read {source}: {len(state)} tensors, global_step {checkpoint['global_step']}")
