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


class Block(nn.Module):
    """bench/matrix/gpt.hpp's block, under the same names: pre-norm causal attention and an MLP."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = x + self.proj(attended.transpose(1, 2).reshape(b, t, w))
        return y + self.fc2(F.gelu(self.fc1(self.ln2(y))))


class GPT(nn.Module):
    def __init__(self, vocab=256, width=64, context=64):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(context, width) * 0.02)
        self.block1, self.block2 = Block(width), Block(width)
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, x):
        return self.head(self.ln(self.block2(self.block1(self.tokens(x) + self.positions[: x.size(1)]))))


MODELS = {  # the network, its optimizer (as the C++ modules' configure_optimizers), one batch
    "mlp": (MLP, lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
            lambda: (torch.randn(64, 32), torch.randint(10, (64,)))),
    "gpt": (GPT, lambda p: torch.optim.AdamW(p, lr=3e-4),
            lambda: (lambda text: (text[:, :64].contiguous(), text[:, 1:].contiguous()))(torch.randint(256, (8, 65)))),
}
MODEL = "mlp"


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


TRUE_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}
MIXED_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def raw_pytorch(precision, init, xs, ys):
    make, make_optimizer, _ = MODELS[MODEL]
    model = make()
    model.load_state_dict(init)
    dtype = TRUE_DTYPES.get(precision)
    if dtype is not None:
        model.to(dtype)
    optimizer = make_optimizer(model.parameters())
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    losses = []
    start = time.perf_counter()
    for x, y in zip(xs, ys):
        if dtype is not None and x.is_floating_point():
            x = x.to(dtype)
        with torch.autocast("cpu", dtype=MIXED_DTYPES.get(precision, torch.bfloat16),
                            enabled=precision in MIXED_DTYPES):
            loss = loss_of(model(x), y)
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
    make, make_optimizer, _ = MODELS[MODEL]
    model = make()
    model.load_state_dict(init)
    optimizer = make_optimizer(model.parameters())
    start = time.perf_counter()
    model, optimizer = f.setup(model, optimizer)
    losses = []
    for x, y in zip(xs, ys):
        optimizer.zero_grad()
        loss = loss_of(model(x), y)
        losses.append(loss.detach())
        f.backward(loss)
        optimizer.step()
    return time.perf_counter() - start, [float(l) for l in losses]


class LitMLP(L.LightningModule):
    def __init__(self, init, log):
        super().__init__()
        self.net = MODELS[MODEL][0]()
        self.net.load_state_dict(init)
        self.losses, self.log_loss = [], log

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = loss_of(self.net(x), y)
        self.losses.append(loss.detach())
        if self.log_loss:
            self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return MODELS[MODEL][1](self.parameters())


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
    out = subprocess.run([worker, mode, precision, folder, MODEL], check=True, capture_output=True, text=True,
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
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--docs")
    parser.add_argument("--plot", help="a PNG of the median step times (min-max as error bars)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless every framework ran and followed raw PyTorch's loss trajectory exactly "
                             "(fulgur and raw LibTorch in every precision, Lightning in 32-true and bf16-mixed)")
    args = parser.parse_args()

    global MODEL
    MODEL = args.model
    torch.manual_seed(0)
    init = MODELS[MODEL][0]().state_dict()
    batches = [MODELS[MODEL][2]() for _ in range(args.steps)]
    xs, ys = [b[0] for b in batches], [b[1] for b in batches]
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
    rows, notes, problems, libtorch_losses = [], [], [], {}
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
        libtorch_losses[precision] = times.get("raw LibTorch losses")
        for name in frameworks:
            if name in failed or reference is None:
                continue
            losses = times.pop(name + " losses", None)
            diff = max(abs(a - b) for a, b in zip(reference, losses)) if losses else float("nan")
            lightning_fp16 = precision == "16-mixed" and name.startswith("Lightning")  # runs bf16 on the CPU
            # The GPT's AdamW: LibTorch's arithmetic (mul + add) is not PyTorch's (lerp), so C++ and
            # Python part at the last bit from the first step on; only the MLP's SGD is the same op for op.
            libtorch_adamw = MODEL != "mlp" and name in ("raw LibTorch", "fulgur")
            if not (diff == 0 and len(losses) == len(reference)) and not lightning_fp16 and not libtorch_adamw:
                problems.append(f"{precision}: {name} differs from raw PyTorch (max {diff:.3g})")
            if name == "fulgur":
                libtorch = times.get("raw LibTorch losses") or libtorch_losses.get(precision)
                if libtorch is not None and libtorch != losses:
                    problems.append(f"{precision}: fulgur differs from raw LibTorch")
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
    if MODEL != "mlp":
        notes.append("raw LibTorch and fulgur step with LibTorch's AdamW, whose arithmetic (mul + add) differs from "
                     "PyTorch's (lerp) in the last bit: their losses part from Python's from the second step on; "
                     "fulgur's equal raw LibTorch's exactly")
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
    header = (f"{MODEL}: {datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
              f"{torch.__version__}, lightning {L.__version__}, 1 thread, {args.steps} steps x {args.repeats} "
              f"interleaved repetitions (the \"vs fulgur\" column: its median step time over fulgur's).")
    text = "\n".join([header, "", *lines, "", "Loss trajectories (first repetition):", "",
                      *[f"- {n}" for n in notes]])
    print(text)
    if args.docs:
        with open(args.docs) as f:
            doc = f.read()
        begin, end = f"<!-- compare.py {MODEL}:begin -->", f"<!-- compare.py {MODEL}:end -->"
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
