"""Reference behaviour for spike_anomaly_tests.cpp, from the venv's Lightning, in one run.

  spike_reference.py <out_dir>

Spike cases: loss sequences (random walks with planted spikes, NaN/inf, mode max, atol only, rtol
only, warm-up over several epochs, a second rank's decisions) fed batch by batch to Lightning
Fabric's SpikeDetection through a minimal stand-in for the Fabric object; after a
TrainingSpikeException the feeding goes on when the case says so (the bad batches accumulate).
<out_dir>/spike_cases.txt holds, per case, its options and inputs and the sequence positions where
Fabric raised; <out_dir>/<case>/skip_batches.json is the file Fabric wrote (absent: no spike).
Numbers are float.hex() (exact; "nan", "inf" as C's strtod reads them).

Anomaly cases: Lightning's Trainer(detect_anomaly=...) fitting the tiny modules of the C++ test for
a few steps in 32-true; <out_dir>/anomaly.txt (written last): per case, the global step at which fit raised (-1:
none), the error's message, and whether the gate parameter ended finite.
"""
import os
import shutil
import sys
import warnings

import torch

warnings.filterwarnings("ignore")
from lightning.fabric.utilities.spike import SpikeDetection, TrainingSpikeException  # noqa: E402


class FakeStrategy:
    """What SpikeDetection asks of fabric.strategy; the 'other rank' decides from scripted lists."""

    root_device = torch.device("cpu")

    def __init__(self):
        self.other_spike = None
        self.other_finite = None
        self.step = 0

    def barrier(self):
        pass

    def reduce_boolean_decision(self, decision, all=True):
        if all:
            return decision and (self.other_finite is None or bool(self.other_finite[self.step]))
        return decision or (self.other_spike is not None and bool(self.other_spike[self.step]))


class FakeFabric:
    global_rank = 0

    def __init__(self):
        self.strategy = FakeStrategy()


def walk(gen, n, start, drift, noise):
    values, value = [], start
    for _ in range(n):
        value = value * (1.0 + drift) + noise * float(torch.randn((), generator=gen))
        values.append(value)
    return values


def make_cases():
    gen = torch.Generator().manual_seed(35)
    cases = []

    def case(name, losses, batch_idx=None, continue_after=True, dtype="float32", other_spike=None,
             other_finite=None, **options):
        cases.append(dict(name=name, losses=losses, batch_idx=batch_idx or list(range(len(losses))),
                          continue_after=continue_after, dtype=dtype, other_spike=other_spike,
                          other_finite=other_finite, options=options))

    w = walk(gen, 80, 2.0, -0.01, 0.02)
    w[30] *= 5.0
    w[31] *= 4.0  # the second of two: compared with a window that the first did not enter
    w[60] *= 3.0
    case("walk_min", w)
    case("walk_min_stop", list(w), continue_after=False)
    w = walk(gen, 60, 1.0, 0.0, 0.05)
    w[2] = float("nan")
    w[20] = float("inf")
    w[35] = float("-inf")
    w[36] = float("nan")
    case("nonfinite", w)
    case("nonfinite_not_finite_only", list(w), finite_only=False)
    w = walk(gen, 40, 1.0, 0.0, 0.05)
    w[1] = float("nan")  # in warm-up: it enters the window (MeanMetric drops it, the slot is taken)
    w[3] = float("inf")  # in warm-up: the running mean is inf until it leaves the window
    w[15] = 9.0
    case("nonfinite_in_warmup", w, warmup=5, window=4)
    acc = [min(0.99, 0.1 + 0.02 * i) + 0.01 * float(torch.randn((), generator=gen)) for i in range(50)]
    acc[25] = 0.02
    acc[40] = 0.3
    case("mode_max", acc, mode="max", rtol=0.5)
    w = walk(gen, 50, 1.0, 0.0, 0.1)
    w[20] += 0.6
    w[30] += 0.4
    w[40] -= 3.0
    case("atol_only", w, atol=0.5, rtol=None)
    case("rtol_only", list(w), rtol=0.3)
    case("atol_and_rtol", list(w), atol=0.1, rtol=0.2, window=5)
    case("neither", list(w)[:6], atol=None, rtol=None, warmup=0)
    neg = walk(gen, 40, -3.0, 0.0, 0.1)
    neg[20] = 5.0
    case("negative_losses", neg, rtol=1.5)
    # Three epochs of 15 batches: warm-up covers each epoch's first batches (batch_idx restarts).
    w = walk(gen, 45, 1.0, 0.0, 0.02)
    for i in (2, 16, 31, 40):
        w[i] *= 6.0
    case("warmup_epochs", w, batch_idx=[i % 15 for i in range(45)], warmup=3)
    w = walk(gen, 30, 1.0, 0.0, 0.05)
    w[12] *= 3.5
    case("window_1", w, window=1, rtol=1.0)
    case("window_3_double", list(w), window=3, rtol=1.0, atol=0.25, dtype="float64")
    case("bfloat16", [float(torch.tensor(v, dtype=torch.bfloat16)) for v in w], rtol=1.0, dtype="bfloat16")
    w = walk(gen, 30, 1.0, 0.0, 0.05)
    w[8] = float("nan")
    other_spike = [0] * 30
    other_spike[15] = 1
    other_finite = [1] * 30
    other_finite[5] = 0
    case("two_ranks", w, other_spike=other_spike, other_finite=other_finite, finite_only=False)
    w = walk(gen, 20, 1.0, 0.0, 0.02)
    w[10] *= 5.0
    case("json_path", w, exclude_batches_path="FILE")
    # A NaN in warm-up is the last value (a decrease after it is "not better") and takes a window slot.
    case("nan_last_value", [2.0, float("nan"), 1.5], warmup=2, window=3, rtol=0.1)
    case("nan_takes_slot", [10.0, float("nan"), 1.0, 2.5], warmup=3, window=2, rtol=1.0)
    # Tolerances compared in float32, as torch compares a float32 tensor with a Python float.
    f32 = float(torch.tensor(0.7, dtype=torch.float32))
    case("atol_float32", [0.0, 0.0, 0.0, 0.0, f32], atol=0.7, rtol=None)
    case("rtol_float32", [1.0, 1.0, 1.0, 1.0, float.fromhex("0x1.e666660000000p+0")], rtol=0.9)
    return cases


def run_case(case, out_dir):
    dtype = getattr(torch, case["dtype"])
    folder = os.path.join(out_dir, case["name"])
    options = dict(case["options"])
    if options.get("exclude_batches_path") == "FILE":
        options["exclude_batches_path"] = os.path.join(folder, "bad.json")
    else:
        options["exclude_batches_path"] = folder
    detector = SpikeDetection(**options)
    fabric = FakeFabric()
    fabric.strategy.other_spike = case["other_spike"]
    fabric.strategy.other_finite = case["other_finite"]
    spikes = []
    for i, (loss, batch_idx) in enumerate(zip(case["losses"], case["batch_idx"])):
        fabric.strategy.step = i
        try:
            detector.on_train_batch_end(fabric, torch.tensor(loss, dtype=dtype), None, batch_idx)
        except TrainingSpikeException as e:
            assert str(e) == f"Training spike detected in batch {batch_idx}"
            spikes.append(i)
            if not case["continue_after"]:
                break
    return spikes


def number(v):
    return "none" if v is None else float(v).hex()


def spike(out_dir):
    lines = []
    for case in make_cases():
        spikes = run_case(case, out_dir)
        o = case["options"]
        lines.append(" ".join([
            "case", case["name"], o.get("mode", "min"), str(o.get("window", 10)), str(o.get("warmup", 1)),
            number(o.get("atol")), number(o.get("rtol", 2.0)), str(int(o.get("finite_only", True))), case["dtype"],
            str(int(case["continue_after"])), "file" if o.get("exclude_batches_path") == "FILE" else "folder"]))
        lines.append("losses " + " ".join(number(v) for v in case["losses"]))
        lines.append("batch_idx " + " ".join(str(b) for b in case["batch_idx"]))
        for key in ("other_spike", "other_finite"):
            lines.append(key + " " + (" ".join(str(v) for v in case[key]) if case[key] else "none"))
        lines.append("spikes " + " ".join(str(s) for s in spikes))
    with open(os.path.join(out_dir, "spike_cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


class GateModule:
    """Built lazily (importing lightning.pytorch is the slow part): a Linear and a `gate` at 0 under sqrt."""

    @staticmethod
    def make(kind):
        import lightning.pytorch as pl

        class Gate(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 1)
                self.gate = torch.nn.Parameter(torch.zeros(1))
                self.entered_step = -1

            def training_step(self, batch, batch_idx):
                self.entered_step = self.trainer.global_step
                x, y = batch
                loss = torch.nn.functional.mse_loss(self.fc(x).squeeze(1), y)
                if kind == "inf":  # d sqrt(g)/dg at 0: 1 / 0 = inf (no NaN in the backward)
                    return loss + self.gate.sqrt().sum()
                # where() hands sqrt's backward a zero gradient: 0 / 0 = NaN, the loss stays finite
                return loss + torch.where(self.gate > 1, self.gate.sqrt(), torch.zeros_like(self.gate)).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Gate()


def anomaly(out_dir):
    import logging

    import lightning.pytorch as pl

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16))
    lines = []
    for name, kind, detect in (("inf_anomaly", "inf", True), ("nan_anomaly", "where", True),
                               ("nan_plain", "where", False)):
        model = GateModule.make(kind)
        trainer = pl.Trainer(max_steps=3, detect_anomaly=detect, accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        raised, message = -1, "none"
        try:
            trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
        except RuntimeError as e:
            raised, message = model.entered_step, str(e).splitlines()[0]
        finite = bool(torch.isfinite(model.gate.detach()).all())
        lines.append(f"{name} {raised} {int(finite)} {message}")
    with open(os.path.join(out_dir, "anomaly.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    shutil.rmtree(sys.argv[1], ignore_errors=True)  # no file of an earlier run left to compare with
    os.makedirs(sys.argv[1])
    spike(sys.argv[1])
    anomaly(sys.argv[1])
