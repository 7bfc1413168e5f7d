"""PyTorch's side of tests/unit/activation_checkpoint_tests.cpp, computed at test time from the venv.

    activation_checkpoint_reference.py IN OUT

IN: the block's weights and input the C++ test wrote, one tensor a line: "<key> <d0,d1,...> <float.hex values>".
OUT: for each precision (32-true, bf16-mixed, 16-mixed), the gradients of a pre-norm MLP block with dropout under
torch.utils.checkpoint.checkpoint(..., use_reentrant=False), dropout drawing from torch.manual_seed(7):
"<precision> <key> <float.hex values>" for the block's weights and its input.
"""
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def read(path):
    tensors = {}
    with open(path) as f:
        for line in f:
            key, shape, *values = line.split()
            tensors[key] = torch.tensor([float.fromhex(v) for v in values], dtype=torch.float32).reshape(
                [int(d) for d in shape.split(",")])
    return tensors


def block(x, w):
    h = F.layer_norm(x, (x.shape[-1],), w["ln.weight"], w["ln.bias"])
    h = F.linear(F.gelu(F.linear(h, w["fc1.weight"], w["fc1.bias"])), w["fc2.weight"], w["fc2.bias"])
    return x + F.dropout(h, 0.2, training=True)


def main(inp, out):
    tensors = read(inp)
    x = tensors.pop("x")
    weights = {k: v.requires_grad_() for k, v in tensors.items()}
    with open(out, "w") as f:
        for precision, dtype in (("32-true", None), ("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)):
            for w in weights.values():
                w.grad = None
            xi = x.clone().requires_grad_()
            torch.manual_seed(7)
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                y = checkpoint(block, xi, weights, use_reentrant=False)
            y.float().pow(2).sum().backward()
            for key, t in list(weights.items()) + [("x", xi)]:
                f.write(f"{precision} {key} " + " ".join(float(v).hex() for v in t.grad.flatten().tolist()) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
