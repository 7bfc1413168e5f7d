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
  run FILE             a whole Tuner(trainer).lr_find on the regression of the C++ test: FILE has
                       the lines "x ...", "y ...", "weight ...", "bias ..." (float32 values), "batch N",
                       "accumulate K" (the Trainer's accumulate_grad_batches)
OUTPUT lines "NAME key values" (repr of Python floats, None where Lightning gives None):
  schedule X...        _ExponentialLR/_LinearLR's lr before each of num_training optimizer steps
  smoothed X...        _LRCallback's losses for the raw losses, and `stop K`: after how many it stopped
  suggestion X / index K
  run_lrs X... / run_losses X... / run_suggestion X   what Lightning's lr_find recorded and suggests
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
    if "run" in cfg:
        lines += lightning_run(cfg["run"][0], mode, min_lr, max_lr, num_training, threshold)
    return lines


def lightning_run(path, mode, min_lr, max_lr, num_training, threshold):
    """Lightning's whole search on the same weights and batches as the C++ test's Regression."""
    import tempfile
    import warnings

    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    values = {}
    for line in open(path):
        key, *rest = line.split()
        values[key] = rest
    x = torch.tensor([float(v) for v in values["x"]], dtype=torch.float32).reshape(-1, 4)
    y = torch.tensor([float(v) for v in values["y"]], dtype=torch.float32).reshape(-1, 1)
    batch = int(values["batch"][0])
    accumulate = int(values["accumulate"][0])

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)
            with torch.no_grad():
                self.fc.weight.copy_(torch.tensor([float(v) for v in values["weight"]]).reshape(1, 4))
                self.fc.bias.copy_(torch.tensor([float(v) for v in values["bias"]]))

        def training_step(self, b, i):
            return torch.nn.functional.mse_loss(self.fc(b[0]), b[1])

        def configure_optimizers(self):  # as RegressionImpl: the bias group has its own lr, no momentum
            return torch.optim.SGD([{"params": [self.fc.weight]}, {"params": [self.fc.bias], "lr": 0.5, "momentum": 0.0}],
                                   lr=0.01, momentum=0.9)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                             accumulate_grad_batches=accumulate)
        found = Tuner(trainer).lr_find(Regression(), train_dataloaders=loader, min_lr=min_lr, max_lr=max_lr,
                                       num_training=num_training, mode=mode, early_stop_threshold=threshold,
                                       update_attr=False)
    return ["run_lrs " + " ".join(repr(v) for v in found.results["lr"]),
            "run_losses " + " ".join(repr(v) for v in found.results["loss"]),
            f"run_suggestion {found.suggestion()!r}"]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
