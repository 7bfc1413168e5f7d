"""fulgur side by side with raw PyTorch, Lightning Fabric, Lightning Trainer and raw LibTorch.

    python bench/compare/compare.py --worker build/bench/bench_compare_worker [--steps 200] [--repeats 5]
        [--precisions 32-true bf16-mixed 16-mixed] [--docs docs/benchmarks.md]

The same tiny MLP (32-64-64-10, SGD momentum 0.9, lr 0.01), the same initial weights and batches (64
samples a step, written here with torch.save and read by the C++ worker), one intra-op thread
everywhere. First the loss trajectories are compared (each framework against raw PyTorch: the
largest difference of a step's loss); then the runs are timed, interleaved (the order rotates each
repetition), and the median step time with its min-max is reported with the ratios
Fabric / fulgur, Trainer / fulgur, raw PyTorch / fulgur and fulgur / raw LibTorch. With --docs the
table replaces the one between the compare.py markers in that file.
"""
import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import lightning as L  # noqa: E402

torch.set_num_threads(1)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


TRUE_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}
MIXED_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def raw_pytorch(precision, init, xs, ys):
    model = MLP()
    model.load_state_dict(init)
    dtype = TRUE_DTYPES.get(precision)
    if dtype is not None:
        model.to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    losses = []
    start = time.perf_counter()
    for x, y in zip(xs, ys):
        if dtype is not None:
            x = x.to(dtype)
        with torch.autocast("cpu", dtype=MIXED_DTYPES.get(precision, torch.bfloat16),
                            enabled=precision in MIXED_DTYPES):
            loss = F.cross_entropy(model(x), y)
        losses.append(loss.detach())
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad()
    return time.perf_counter() - start, [float(l) for l in losses]


def fabric(precision, init, xs, ys):
    f = L.Fabric(accelerator="cpu", devices=1, precision=precision)
    model = MLP()
    model.load_state_dict(init)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    start = time.perf_counter()
    model, optimizer = f.setup(model, optimizer)
    losses = []
    for x, y in zip(xs, ys):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        losses.append(loss.detach())
        f.backward(loss)
        optimizer.step()
    return time.perf_counter() - start, [float(l) for l in losses]


class LitMLP(L.LightningModule):
    def __init__(self, init, log):
        super().__init__()
        self.net = MLP()
        self.net.load_state_dict(init)
        self.losses, self.log_loss = [], log

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(loss.detach())
        if self.log_loss:
            self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2, momentum=0.9)


def trainer(precision, init, xs, ys, logged=False):
    module = LitMLP(init, logged)
    loader = torch.utils.data.DataLoader(list(zip(xs, ys)), batch_size=None)
    with tempfile.TemporaryDirectory() as root:
        t = L.Trainer(accelerator="cpu", devices=1, precision=precision, max_epochs=1, num_sanity_val_steps=0,
                      logger=L.pytorch.loggers.CSVLogger(root) if logged else False, enable_checkpointing=False,
                      enable_progress_bar=logged, enable_model_summary=False, default_root_dir=root)
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            start = time.perf_counter()
            t.fit(module, loader)
            seconds = time.perf_counter() - start
    return seconds, [float(l) for l in module.losses]


def cpp(worker, mode, precision, folder):
    out = subprocess.run([worker, mode, precision, folder], check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1")).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["seconds"], result["losses"]


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r[1] != "ratios" and r[2] is not None]
    precisions = list(dict.fromkeys(r[0] for r in measured))
    names = list(dict.fromkeys(r[1] for r in measured))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, name in enumerate(names):
        xs, medians, below, above = [], [], [], []
        for j, precision in enumerate(precisions):
            row = next((r for r in measured if r[0] == precision and r[1] == name), None)
            if row:
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                medians.append(row[2])
                below.append(row[2] - row[3])
                above.append(row[4] - row[2])
        ax.bar(xs, medians, width, yerr=[below, above], capsize=2, label=name)
    ax.set_xticks(range(len(precisions)), precisions)
    ax.set_ylabel("µs per training step (median, min-max)")
    ax.set_title(title.split(" (")[0], fontsize=8)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--docs")
    parser.add_argument("--plot", help="a PNG of the median step times (min-max as error bars)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless every framework ran and followed raw PyTorch's loss trajectory exactly "
                             "(fulgur and raw LibTorch in every precision, Lightning in 32-true and bf16-mixed)")
    args = parser.parse_args()

    torch.manual_seed(0)
    init = MLP().state_dict()
    xs = [torch.randn(64, 32) for _ in range(args.steps)]
    ys = [torch.randint(10, (64,)) for _ in range(args.steps)]
    folder = tempfile.mkdtemp(prefix="fulgur-compare-")
    torch.save(init, os.path.join(folder, "init.pt"))
    torch.save({"x": torch.stack(xs), "y": torch.stack(ys)}, os.path.join(folder, "data.pt"))

    frameworks = {
        "raw PyTorch": lambda p: raw_pytorch(p, init, xs, ys),
        "Lightning Fabric": lambda p: fabric(p, init, xs, ys),
        "Lightning Trainer": lambda p: trainer(p, init, xs, ys),
        "Lightning Trainer + bar + CSV": lambda p: trainer(p, init, xs, ys, logged=True),
        "raw LibTorch": lambda p: cpp(args.worker, "libtorch", p, folder),
        "fulgur": lambda p: cpp(args.worker, "fulgur", p, folder),
    }
    rows, notes, problems = [], [], []
    for precision in args.precisions:
        times = {name: [] for name in frameworks}
        failed = {}
        reference = None
        for name in frameworks:  # a warm-up run of each, not timed (first-call costs, allocator)
            try:
                frameworks[name](precision)
            except Exception:  # noqa: BLE001 - the timed runs report it
                pass
        for repeat in range(args.repeats):
            names = list(frameworks)
            names = names[repeat % len(names):] + names[:repeat % len(names)]
            for name in names:
                if name in failed:
                    continue
                try:
                    seconds, losses = frameworks[name](precision)
                except Exception as e:  # noqa: BLE001 - reported, not hidden
                    failed[name] = str(e).splitlines()[0][:120]
                    continue
                times[name].append(seconds / args.steps * 1e6)
                if repeat == 0:
                    if name == "raw PyTorch":
                        reference = losses
                    times[name + " losses"] = losses
        problems.extend(f"{precision}: {name} failed: {error}" for name, error in failed.items())
        for name in frameworks:
            if name in failed or reference is None:
                continue
            losses = times.pop(name + " losses", None)
            diff = max(abs(a - b) for a, b in zip(reference, losses)) if losses else float("nan")
            lightning_fp16 = precision == "16-mixed" and name.startswith("Lightning")  # runs bf16 on the CPU
            if not (diff == 0 and len(losses) == len(reference)) and not lightning_fp16:
                problems.append(f"{precision}: {name} differs from raw PyTorch (max {diff:.3g})")
            notes.append(f"{precision}: {name}: {len(losses or [])} losses, max |loss - raw PyTorch's| = {diff:.3g}")
        fulgur = statistics.median(times["fulgur"]) if times["fulgur"] else float("nan")
        for name in frameworks:
            if name in failed:
                rows.append((precision, name, None, None, None, failed[name]))
                continue
            values = times[name]
            median = statistics.median(values)
            rows.append((precision, name, median, min(values), max(values), None))
        rows.append((precision, "ratios", fulgur, None, None, None))

    shutil.rmtree(folder, ignore_errors=True)
    if "16-mixed" in args.precisions:  # Lightning's connector: "AMP with fp16 is not supported on CPU"
        notes.append("16-mixed: Lightning Fabric and Trainer replace '16-mixed' on the CPU by 'bf16-mixed' (with a "
                     "warning), so their 16-mixed rows run bfloat16 autocast without a scaler; raw PyTorch, raw "
                     "LibTorch and fulgur run float16 autocast with a GradScaler")
    lines = ["| precision | framework | median µs/step | min–max | vs fulgur |", "|---|---|---:|---:|---:|"]
    for precision, name, median, low, high, error in rows:
        if name == "ratios":
            continue
        if error:
            lines.append(f"| {precision} | {name} | — | — | failed: {error} |")
            continue
        fulgur = next((r[2] for r in rows if r[0] == precision and r[1] == "fulgur" and r[2]), None)
        versus = f"{median / fulgur:.2f}x" if fulgur else "—"
        lines.append(f"| {precision} | {name} | {median:.1f} | {low:.1f}–{high:.1f} | {versus} |")
    header = (f"{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
              f"{torch.__version__}, lightning {L.__version__}, 1 thread, {args.steps} steps x {args.repeats} "
              f"interleaved repetitions (the \"vs fulgur\" column: its median step time over fulgur's).")
    text = "\n".join([header, "", *lines, "", "Loss trajectories (first repetition):", "",
                      *[f"- {n}" for n in notes]])
    print(text)
    if args.docs:
        with open(args.docs) as f:
            doc = f.read()
        begin, end = "<!-- compare.py:begin -->", "<!-- compare.py:end -->"
        if begin in doc and end in doc:
            doc = doc[:doc.index(begin) + len(begin)] + "\n" + text + "\n" + doc[doc.index(end):]
            with open(args.docs, "w") as f:
                f.write(doc)
        else:
            print(f"{args.docs} has no {begin} ... {end} markers; nothing written", file=sys.stderr)
    if args.plot:
        plot(rows, args.plot, header)
    if args.check:
        for p in problems:
            print("PROBLEM:", p)
        print("same trajectories" if not problems else f"{len(problems)} problems")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
