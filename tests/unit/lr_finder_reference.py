"""Lightning's own learning-rate finder code on the inputs a test gives: tests/unit/lr_finder_tests.cpp.

usage: lr_finder_reference.py INPUT OUTPUT

INPUT: cases (one Python start for them all: importing Lightning is the slow part), each
"case NAME" followed by lines:
  mode exponential|linear
  min_lr X / max_lr X / num_training N / threshold X|None
  raw L1 L2 ...        the training_step losses of a run (optional)
  lrs X1 X2 ...        a recorded (lr, loss) sequence for suggestion() (optional)
  losses L1 L2 ...
  skip BEGIN END       suggestion's arguments (optional; Lightning's defaults otherwise)
OUTPUT lines "NAME key values" (repr of Python floats, None where Lightning gives None):
  schedule X...        _ExponentialLR/_LinearLR's lr before each of num_training optimizer steps
  smoothed X...        _LRCallback's losses for the raw losses, and `stop K`: after how many it stopped
  suggestion X / index K
"""
import sys
from types import SimpleNamespace

import torch
from lightning.pytorch.tuner.lr_finder import _ExponentialLR, _LinearLR, _LRCallback, _LRFinder


def main(inp, out):
    cases, cfg = [], None
    for line in open(inp):
        parts = line.split()
        if parts and parts[0] == "case":
            cfg = {}
            cases.append((parts[1], cfg))
        elif parts:
            cfg[parts[0]] = parts[1:]
    lines = []
    for name, cfg in cases:
        lines += [f"{name} {line}" for line in reference(cfg)]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def reference(cfg):
    mode = cfg["mode"][0]
    min_lr, max_lr = float(cfg["min_lr"][0]), float(cfg["max_lr"][0])
    num_training = int(cfg["num_training"][0])
    threshold = None if cfg["threshold"][0] == "None" else float(cfg["threshold"][0])
    lines = []

    # The schedule exactly as lr_find builds it: min_lr on every group, the scheduler stepped per step.
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [param]}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 5.0}], lr=0.1)
    for group in optimizer.param_groups:
        group["lr"] = min_lr
        group["initial_lr"] = min_lr
    scheduler = (_LinearLR if mode == "linear" else _ExponentialLR)(optimizer, max_lr, num_training)
    schedule = []
    for _ in range(num_training):
        schedule.append(scheduler.lr[0])
        assert all(g["lr"] == scheduler.lr[0] for g in optimizer.param_groups)
        optimizer.step()
        scheduler.step()
    lines.append("schedule " + " ".join(repr(x) for x in schedule))

    if "raw" in cfg:
        callback = _LRCallback(num_training, threshold)
        trainer = SimpleNamespace(
            fit_loop=SimpleNamespace(batch_idx=0), accumulate_grad_batches=1, global_step=0, should_stop=False,
            strategy=SimpleNamespace(broadcast=lambda x: x))
        stop = None
        for k, value in enumerate(cfg["raw"]):
            trainer.global_step = k + 1  # after the optimizer step, as in on_train_batch_end
            callback.on_train_batch_end(trainer, None, torch.tensor(float(value)), None, k)
            if trainer.should_stop:
                stop = k + 1
                break
        lines.append("smoothed " + " ".join(repr(x) for x in callback.losses))
        lines.append(f"stop {stop}")

    if "lrs" in cfg:
        finder = _LRFinder(mode, min_lr, max_lr, num_training)
        finder.results = {"lr": [float(x) for x in cfg["lrs"]], "loss": [float(x) for x in cfg["losses"]]}
        args = [int(x) for x in cfg["skip"]] if "skip" in cfg else []
        lr = finder.suggestion(*args)
        lines.append(f"suggestion {lr!r}")
        lines.append(f"index {finder._optimal_idx}")
    return lines


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
