"""fulgur side by side with raw PyTorch, Lightning Fabric, Lightning Trainer and raw LibTorch.

    python bench/compare/compare.py --worker build/bench/bench_compare_worker [--steps 200] [--repeats 5]
        [--precisions 32-true bf16-mixed 16-mixed] [--model mlp|gpt|gpt-large] [--device cpu|cuda]
        [--docs docs/benchmarks.md] [--plot [PNG]] [--check]

The same tiny MLP (32-64-64-10, SGD momentum 0.9, lr 0.01), the same initial weights and batches (64
samples a step, written here with torch.save and read by the C++ worker), one intra-op thread
everywhere. First the loss trajectories are compared (each framework against raw PyTorch: the
largest difference of a step's loss); then the runs are timed, interleaved (the order rotates each
repetition), and the median step time with its min-max is reported with the ratios
Fabric / fulgur, Trainer / fulgur, raw PyTorch / fulgur and fulgur / raw LibTorch. With --docs the
table replaces the one between the compare.py markers in that file.

The arguments, the --docs file's markers and the worker (`bench_compare_worker --probe`) are checked before
anything runs (and before torch loads). --docs and --plot are written only when every run succeeded and,
with --check, the check passed; a failed run (its row shows the worker's own error line) makes the exit
status 1.

DDP (--ddp): the MLP on 1 and 2 ranks (--ranks) on the CPU over Gloo, weak scaling (64 samples per rank
a step: rank r trains on rows 64r..64r+63 of each global batch, which is the same 64-sample batch for
rank 0 at every world size), one intra-op thread per rank:

    python bench/compare/compare.py --worker build/bench/bench_compare_worker --ddp [--ranks 1 2]
        [--steps 1000] [--warmup 100] [--repeats 5] [--docs docs/benchmarks.md] [--plot [PNG]] [--check]

    torch DDP          torch.nn.parallel.DistributedDataParallel, a hand-written loop, under torchrun --standalone
    Lightning ddp      Lightning's Trainer(strategy="ddp", devices=R), no sampler (each rank's loader holds its
                       slice), progress bar, logger, checkpointing and model summary off, under torchrun --standalone
    raw LibTorch       the loop by hand in C++, the gradients averaged as one flat tensor through fulgur's
                       ProcessGroup after backward, started by fulgur's launcher
    fulgur             Trainer<CPUAccelerator, BasicDDPStrategy<backend::Gloo>, FloatPrecision>, started by its
                       own launcher (devices=R, the program re-executed once per rank)

Every rank reports the time of steps --warmup.. between two barriers (one before the first of them, one
after the last), so process start, rendezvous, set-up and warm-up are left out; rank 0 reports its
own (local, not all-reduced) loss of every step. The check: rank 0's losses of every framework against
torch DDP's at the same number of ranks, max |difference| <= DDP_TOLERANCE. The table gives median and
min-max of the step time, samples/s (ranks x 64 / step time) and each framework's median over fulgur's;
--plot draws samples/s against ranks (default docs/images/compare_cpu_ddp.png); the --docs section is
the one between the "compare.py ddp" markers.

GPU (--device cuda; what scripts/gpu_bench.sh runs): the GPT at GPT-2-small size on one CUDA device,

    python bench/compare/compare.py --worker build-gpu/bench/bench_compare_worker --device cuda --model gpt-large
        [--precisions 32-true 16-mixed bf16-mixed bf16-true] [--steps 25] [--warmup 5] [--repeats 2]
        [--layers 12] [--width 768] [--heads WIDTH/64] [--context 1024] [--vocab 50304] [--batch 16]
        [--peak-tflops X] [--docs docs/benchmarks.md] [--plot [PNG]] [--json FILE]

    gpt-large          bench/matrix/gpt.hpp's GPT (and GPT here) with 12 pre-norm blocks, width 768, 12 heads (head
                       size 64), context 1024, vocabulary 50304 (GPT-2 small's shape, the head not tied to the token
                       embedding), AdamW lr 3e-4, 16 sequences of 1024 tokens a step; each shape flag overrides one
                       of these (the CPU smoke test runs it tiny)
    frameworks         fulgur (Trainer<CUDAAccelerator, SingleDeviceStrategy, P> through fulgur::dispatch), raw
                       LibTorch (the same loop by hand: bench/matrix.hpp's hand_written), Lightning Fabric
                       (accelerator="cuda") and raw PyTorch; the Lightning Trainer only on the CPU
    timing             each run trains --steps steps from the same weights on the same batches (moved to the device
                       a step at a time, as a loader's would be); the first --warmup (default min(5, steps // 2)) are
                       not timed: the clock reads after a device synchronization before step --warmup and after the
                       last step (none in between); no untimed warm-up run
    tokens/s           batch x context / median step time
    MFU                model FLOPs per token x tokens/s / the GPU's dense peak FLOP/s in the precision's matmul
                       dtype. FLOPs per token: 6 N + 12 L T d, the PaLM paper's estimate (nanoGPT's estimate_mfu):
                       N the non-embedding parameters (all but the token embedding and the positions; the untied
                       head counts), L blocks, T context, d width; the attention term counts all T x T scores,
                       though causal attention needs half. Peaks (TFLOP/s, dense): H100 SXM and H200 989 bf16/fp16,
                       494 TF32, 67 fp32; H100 PCIe 756, 378, 51; A100 312, 156, 19.5. 32-true counts fp32, or TF32
                       when torch.backends.cuda.matmul.allow_tf32 is on. Another GPU: "n/a" and the reason, unless
                       --peak-tflops gives the peak (for every precision)
    peak GiB           the CUDA caching allocator's peak of allocated memory in the run (torch.cuda.max_memory_allocated;
                       in C++ c10's allocator statistics, as bench_matrix reads them)

On a machine without CUDA, --device cuda stops before anything runs (the worker's `--cuda` answer, then torch's).
--docs writes the section between the "compare.py gpu" markers, --plot tokens/s per precision and framework
(default docs/images/compare_gpu_gpt.png), --json the results (rows, peaks, losses, shape) for the record. On the
CPU, --model gpt-large runs the same way (the timing window, tokens/s; MFU "n/a" without --peak-tflops; the
Lightning Trainer too); its --docs section would be "compare.py gpt-large".
"""
import argparse
import contextlib
import datetime
import gc
import importlib.util
import io
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

# What the arguments may name, known before torch and Lightning load (they take seconds): --help and a
# bad argument answer at once, and nothing runs until the worker, --docs and --plot have been checked.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")  # fulgur's and Lightning's
DEFAULT_PRECISIONS = ["32-true", "bf16-mixed", "16-mixed"]
MODEL_NAMES = ("gpt", "gpt-large", "mlp")
DEVICES = ("cpu", "cuda")
GPU_PRECISIONS = ["32-true", "16-mixed", "bf16-mixed", "bf16-true"]  # --device cuda's default
# gpt-large's shape (GPT-2 small's, the vocabulary padded to a multiple of 64 as nanoGPT's) and sequences a step:
# 16 x 1024 tokens keep an H100 busy at bf16 (about 25 GB at 32-true). heads None: width // 64 (head size 64).
GPT_LARGE = {"layers": 12, "width": 768, "heads": None, "context": 1024, "vocab": 50304, "batch": 16}
WINDOW_WARMUP = 5  # the untimed first steps of a timed-window run (at most half of --steps) unless --warmup
DDP_BATCH = 64  # samples per rank a step (weak scaling: fixed per rank)
# The largest |rank-0 loss - torch DDP's| --ddp --check allows: a few float32 ulps of a loss near 2.3, room for
# another order of the gradient average (fulgur sums, then divides by the world size; torch DDP divides first:
# the same bits for 1 and 2 ranks, not for 3). Measured here: 0.
DDP_TOLERANCE = 1e-6
WORKER_MODES = ("fulgur", "libtorch", "fulgur-ddp", "libtorch-ddp")


# Dense peak TFLOP/s of the matmuls by GPU and dtype (NVIDIA's data sheets, without sparsity).
H100_SXM = {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0, "fp64": 67.0}
PEAK_TFLOPS = [("H100 PCIE", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0, "fp64": 51.0}),
               ("H100", H100_SXM), ("H200", H100_SXM),  # SXM (H100 80GB HBM3, H200); NVL parts: unknown
               ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5, "fp64": 19.5})]
MATMUL_DTYPE = {"32-true": "fp32", "16-mixed": "fp16", "bf16-mixed": "bf16", "bf16-true": "bf16", "16-true": "fp16",
                "64-true": "fp64"}


def peak_tflops(gpu, precision, tf32):
    """(the dense peak TFLOP/s of `gpu` (a CUDA device name, or None for the CPU) for `precision`, None), or
    (None, why there is none)."""
    if gpu is None:
        return None, "no peak FLOP/s is known for a CPU (give --peak-tflops)"
    dtype = "tf32" if MATMUL_DTYPE[precision] == "fp32" and tf32 else MATMUL_DTYPE[precision]
    name = gpu.upper()
    for part, peaks in PEAK_TFLOPS:
        if part in name and "NVL" not in name:
            return peaks[dtype], None
    return None, (f"no peak FLOP/s is known for {gpu!r} (compare.py knows H100 SXM and PCIe, H200, A100; give "
                  "--peak-tflops)")


def section(args):
    """The --docs section (and --plot name) this run writes."""
    return "ddp" if args.ddp else "gpu" if args.device == "cuda" else args.model


def markers(key):
    return f"<!-- compare.py {key}:begin -->", f"<!-- compare.py {key}:end -->"


def worker_problem(worker):
    """None when `worker` is a bench_compare_worker with every mode and model this script runs, else why not."""
    if not os.path.exists(worker):
        return "no such file"
    if os.path.isdir(worker):
        return "a directory"
    if not os.access(worker, os.X_OK):
        return "not executable"
    try:  # `--probe` answers "bench_compare_worker MODE... MODEL..." and exit status 0
        done = subprocess.run([worker, "--probe"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`{worker} --probe` failed: {e}"
    words = done.stdout.split()
    if done.returncode != 0 or words[:1] != ["bench_compare_worker"]:
        answer = (done.stderr.strip() or done.stdout.strip() or "nothing").splitlines()[0][:100]
        return f"`--probe` answered exit status {done.returncode} and {answer!r}"
    missing = [m for m in (*WORKER_MODES, *MODEL_NAMES) if m not in words[1:]]  # gpt-large: the OPTIONs too
    if missing:
        return f"an older build without {', '.join(missing)}"
    return None


def cuda_problem(worker):
    """None when the worker's LibTorch sees a CUDA device (`bench_compare_worker --cuda`), else its answer."""
    try:
        done = subprocess.run([worker, "--cuda"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`{worker} --cuda` failed: {e}"
    if done.returncode == 0 and done.stdout.split()[:2] == ["bench_compare_worker", "cuda"]:
        return None
    return (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()[0]


def docs_problem(path, key):
    """None when `path` is a writable file holding the markers of the section `key`, else why not."""
    if not os.path.isfile(path):
        return f"--docs {path}: no such file"
    if not os.access(path, os.R_OK | os.W_OK):
        return f"--docs {path}: not readable and writable"
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    begin, end = markers(key)
    if begin not in doc or end not in doc or doc.index(begin) > doc.index(end):
        return f"--docs {path} has no {begin} ... {end} markers (the section this run writes); nothing would be written"
    return None


def count(low):
    """An argparse type: a whole number >= low."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, not {text!r}")
        return value

    parse.__name__ = "count"
    return parse


def positive(text):
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, not {text!r}")
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", required=True, help="the bench_compare_worker program (CMake target)")
    parser.add_argument("--steps", type=count(1), default=200)
    parser.add_argument("--repeats", type=count(1), default=5)
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, metavar="PRECISION",
                        help=f"of {', '.join(PRECISIONS)} (default: {' '.join(DEFAULT_PRECISIONS)}; --ddp: 32-true)")
    parser.add_argument("--model", choices=MODEL_NAMES, default="mlp")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cuda: one CUDA device (see GPU above; default precisions: " + " ".join(GPU_PRECISIONS) + ")")
    shape = parser.add_argument_group("gpt-large's shape (default GPT-2 small's: 12, 768, width/64, 1024, 50304; 16 "
                                      "sequences a step)")
    shape.add_argument("--layers", type=count(1))
    shape.add_argument("--width", type=count(1))
    shape.add_argument("--heads", type=count(1), help="default: width // 64, at least 1")
    shape.add_argument("--context", type=count(1))
    shape.add_argument("--vocab", type=count(2))
    shape.add_argument("--batch", type=count(1), help="sequences a step")
    parser.add_argument("--peak-tflops", type=positive, help="the device's peak TFLOP/s for MFU (every precision); "
                        "default: by GPU name and precision (see above)")
    parser.add_argument("--json", help="also write the results to this file (JSON)")
    parser.add_argument("--ddp", action="store_true", help="DDP on the CPU over Gloo (the MLP, 32-true; see above)")
    parser.add_argument("--ranks", type=count(1), nargs="+", default=[1, 2], help="with --ddp: the world sizes")
    parser.add_argument("--warmup", type=count(0),
                        help="the untimed first steps of each run (fewer than --steps; --ddp: default 20); without "
                        "--ddp it times a window (as --device cuda and --model gpt-large do, default "
                        f"min({WINDOW_WARMUP}, steps // 2))")
    parser.add_argument("--docs", help="a Markdown file whose section between the compare.py markers this run "
                        "rewrites (only when every run succeeded and, with --check, the check passed)")
    parser.add_argument("--plot", nargs="?", const="", help="a PNG of the results (default: docs/images/"
                        "compare_cpu.png, compare_cpu_gpt.png or compare_cpu_ddp.png)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless every framework ran and followed raw PyTorch's loss trajectory exactly "
                             "(fulgur and raw LibTorch in every precision, Lightning in 32-true and bf16-mixed); "
                             f"with --ddp, torch DDP's within {DDP_TOLERANCE:g}")
    args = parser.parse_args(argv)
    if args.ddp and args.model != "mlp":
        parser.error("--ddp runs the MLP only")
    if args.ddp and args.precisions:
        parser.error("--ddp runs 32-true only: leave out --precisions")
    if args.ddp and args.device != "cpu":
        parser.error("--ddp runs on the CPU over Gloo: leave out --device cuda")
    if args.warmup is not None and args.warmup >= args.steps:
        parser.error(f"--warmup ({args.warmup}) must be below --steps ({args.steps}): the steps after it are timed")
    args.windowed = not args.ddp and (args.device == "cuda" or args.model == "gpt-large" or args.warmup is not None)
    if args.warmup is None:
        args.warmup = 20 if args.ddp else min(WINDOW_WARMUP, args.steps // 2) if args.windowed else 0
    args.shape = dict(GPT_LARGE)
    for key in GPT_LARGE:
        if getattr(args, key) is not None:
            if args.model != "gpt-large":
                parser.error(f"--{key} sets gpt-large's shape: it needs --model gpt-large")
            args.shape[key] = getattr(args, key)
    if args.shape["heads"] is None:
        args.shape["heads"] = max(1, args.shape["width"] // 64)
    if args.shape["width"] % args.shape["heads"]:
        parser.error(f"--width ({args.shape['width']}) must be a multiple of --heads ({args.shape['heads']})")
    if args.json:
        folder = os.path.dirname(os.path.abspath(args.json))
        if not os.path.isdir(folder):
            parser.error(f"--json {args.json}: the folder {folder} does not exist")
    default = GPU_PRECISIONS if args.device == "cuda" or args.model == "gpt-large" else DEFAULT_PRECISIONS
    args.precisions = list(dict.fromkeys(args.precisions or default))
    args.ranks = list(dict.fromkeys(args.ranks))
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        parser.error(f"--plot needs matplotlib, which {sys.executable} cannot import")
    if args.plot:
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            parser.error(f"--plot {args.plot}: the folder {folder} does not exist")
    if args.docs:
        problem = docs_problem(args.docs, section(args))
        if problem:
            parser.error(problem)
    problem = worker_problem(args.worker)
    if problem:
        parser.error(f"--worker {args.worker} is not bench_compare_worker ({problem}; build it with "
                     "cmake --build build --target bench_compare_worker)")
    if args.device == "cuda":
        problem = cuda_problem(args.worker)
        if problem:
            parser.error(f"--device cuda: no CUDA device here ({problem}); run it on a machine with an NVIDIA GPU "
                         "and a CUDA build of torch (scripts/gpu_bench.sh)")
    return args


if __name__ == "__main__":
    ARGS = parse_args()

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

    def __init__(self, width, heads):
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
    """bench/matrix/gpt.hpp's GPT (GptOptions), made in the same order under the same names: tokens, positions,
    block1..blockN, ln, head. The defaults are the small GPT's (--model gpt)."""

    def __init__(self, vocab=256, width=64, context=64, layers=2, heads=4):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = [Block(width, heads) for _ in range(layers)]
        for i, block in enumerate(self.blocks, 1):
            setattr(self, f"block{i}", block)
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, x):
        x = self.tokens(x) + self.positions[: x.size(1)]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def large_gpt():
    return GPT(**{key: SHAPE[key] for key in ("vocab", "width", "context", "layers", "heads")})


def large_batch():
    text = torch.randint(SHAPE["vocab"], (SHAPE["batch"], SHAPE["context"] + 1))
    return text[:, :-1].contiguous(), text[:, 1:].contiguous()


MODELS = {  # the network, its optimizer (as the C++ modules' configure_optimizers), one batch
    "mlp": (MLP, lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
            lambda: (torch.randn(64, 32), torch.randint(10, (64,)))),
    "gpt": (GPT, lambda p: torch.optim.AdamW(p, lr=3e-4),
            lambda: (lambda text: (text[:, :64].contiguous(), text[:, 1:].contiguous()))(torch.randint(256, (8, 65)))),
    "gpt-large": (large_gpt, lambda p: torch.optim.AdamW(p, lr=3e-4), large_batch),
}
MODEL = "mlp"
SHAPE = dict(GPT_LARGE)  # gpt-large's (main sets it from the arguments)
assert sorted(MODELS) == sorted(MODEL_NAMES), "MODEL_NAMES (the --model choices) must name MODELS' keys"


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


TRUE_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}
MIXED_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class Window:
    """Times steps first..last: sync() (a barrier of every rank, or torch.cuda.synchronize) before step `first` and
    after step `last`."""

    def __init__(self, first, last, sync=lambda: None):
        self.first, self.last, self.sync, self.t0, self.t1 = first, last, sync, None, None

    def start(self, step):
        if step == self.first:
            self.sync()
            self.t0 = time.perf_counter()

    def end(self, step):
        if step == self.last:
            self.sync()
            self.t1 = time.perf_counter()

    def step_us(self):
        return (self.t1 - self.t0) * 1e6 / (self.last - self.first + 1)


def made_on(device):
    """The model of MODEL with its parameters made on `device` (at once on a GPU: no slow CPU initialization)."""
    with torch.device(device) if device != "cpu" else contextlib.nullcontext():
        return MODELS[MODEL][0]()


def raw_pytorch(precision, init, xs, ys, wrap=None, window=None, device="cpu"):
    """wrap: applied to the model before the optimizer is made (DistributedDataParallel); window: a Window, told
    where each step starts and ends; each step's batch is moved to `device` in the step."""
    make_optimizer = MODELS[MODEL][1]
    model = made_on(device)
    model.load_state_dict(init)
    dtype = TRUE_DTYPES.get(precision)
    if dtype is not None:
        model.to(dtype)
    if wrap is not None:
        model = wrap(model)
    optimizer = make_optimizer(model.parameters())
    scaler = torch.amp.GradScaler(device) if precision == "16-mixed" else None
    losses = []
    start = time.perf_counter()
    for step, (x, y) in enumerate(zip(xs, ys)):
        if window is not None:
            window.start(step)
        x, y = x.to(device), y.to(device)  # the CPU: the same tensors
        if dtype is not None and x.is_floating_point():
            x = x.to(dtype)
        with torch.autocast(device, dtype=MIXED_DTYPES.get(precision, torch.bfloat16),
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
        if window is not None:
            window.end(step)
    return time.perf_counter() - start, [float(l) for l in losses]


def fabric(precision, init, xs, ys, window=None, device="cpu"):
    f = L.Fabric(accelerator=device, devices=1, precision=precision)
    model = made_on(device)
    model.load_state_dict(init)
    optimizer = MODELS[MODEL][1](model.parameters())
    start = time.perf_counter()
    model, optimizer = f.setup(model, optimizer)
    losses = []
    for step, (x, y) in enumerate(zip(xs, ys)):
        if window is not None:
            window.start(step)
        x, y = x.to(f.device), y.to(f.device)  # the CPU: the same tensors
        optimizer.zero_grad()
        loss = loss_of(model(x), y)
        losses.append(loss.detach())
        f.backward(loss)
        optimizer.step()
        if window is not None:
            window.end(step)
    return time.perf_counter() - start, [float(l) for l in losses]


class LitMLP(L.LightningModule):
    def __init__(self, init, log, window=None):
        super().__init__()
        self.net = MODELS[MODEL][0]()
        self.net.load_state_dict(init)
        self.losses, self.log_loss, self.window = [], log, window

    def on_train_batch_start(self, batch, batch_idx):
        if self.window is not None:
            self.window.start(batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.window is not None:
            self.window.end(batch_idx)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = loss_of(self.net(x), y)
        self.losses.append(loss.detach())
        if self.log_loss:
            self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return MODELS[MODEL][1](self.parameters())


def trainer(precision, init, xs, ys, logged=False, strategy="auto", devices=1, window=None, device="cpu"):
    """Under strategy="ddp" each rank's xs, ys are its own slice: no distributed sampler."""
    module = LitMLP(init, logged, window)
    loader = torch.utils.data.DataLoader(list(zip(xs, ys)), batch_size=None)
    with tempfile.TemporaryDirectory() as root:
        t = L.Trainer(accelerator=device, devices=devices, strategy=strategy, precision=precision, max_epochs=1,
                      num_sanity_val_steps=0, logger=L.pytorch.loggers.CSVLogger(root) if logged else False,
                      enable_checkpointing=False, enable_progress_bar=logged, enable_model_summary=False,
                      use_distributed_sampler=False, default_root_dir=root)
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            start = time.perf_counter()
            t.fit(module, loader)
            seconds = time.perf_counter() - start
    return seconds, [float(l) for l in module.losses]


def last_json(command):
    """Runs a command (one intra-op thread); its result is the last line of its output that is a JSON object."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(failure(done))
    return json.loads(lines[-1])


def failure(done):
    """One line for a failed run: the worker's first "bench_compare_worker: why" line (under a launcher, the
    rank that failed first; the others' lines follow), else the last line of its stderr (or stdout), after
    its exit status or signal."""
    lines = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("bench_compare_worker:")]
    why = own[0] if own else next((line for line in reversed(done.stderr.splitlines()) if line.strip()),
                                   lines[-1] if lines else "no output")
    if done.returncode < 0:
        try:
            status = f"killed by {signal.Signals(-done.returncode).name}"
        except ValueError:
            status = f"killed by signal {-done.returncode}"
    else:
        status = f"exit status {done.returncode}" + ("" if done.returncode else ", no result line")
    return f"{status}: {why.strip()}"


def cpp(worker, mode, precision, folder, options=()):
    """The worker's run: (seconds, losses); with options (a timing window): (µs a step, losses, peak MiB or None)."""
    result = last_json([worker, mode, precision, folder, MODEL, *options])
    if "step_us" in result:
        return result["step_us"], result["losses"], result["peak_mib"] if result["peak_mib"] >= 0 else None
    return result["seconds"], result["losses"]


RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_rank.py")


def ddp_commands(worker, folder, warmup):
    """framework -> (ranks -> the command that trains it on that many ranks)."""
    def python(framework):
        return lambda ranks: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc-per-node={ranks}", RANK_SCRIPT, framework, folder, str(warmup)]

    def cpp_ddp(mode):  # fulgur's launcher starts the ranks (a free port of its own)
        return lambda ranks: [worker, mode, str(ranks), folder, str(warmup)]

    return {"torch DDP": python("torch"), "Lightning ddp": python("lightning"),
            "raw LibTorch": cpp_ddp("libtorch-ddp"), "fulgur": cpp_ddp("fulgur-ddp")}


def interleaved(runs, repeats, warm_up, peaks=None):
    """Runs each of `runs` (key -> () -> (µs per step, losses[, peak MiB or None])) `repeats` times, the order
    rotating each repetition, after one untimed run of each if warm_up. Returns each key's µs, the losses of its
    first timed run, and the first line of the error of each that failed (not run again); `peaks` (a dict), when
    given, gets each key's largest peak."""
    if warm_up:
        for run in runs.values():  # first-call costs (allocator, kernel selection), not timed
            try:
                run()
            except Exception:  # noqa: BLE001 - the timed runs report it
                pass
    times, losses, failed = {key: [] for key in runs}, {}, {}
    keys = list(runs)
    for repeat in range(repeats):
        for key in keys[repeat % len(keys):] + keys[:repeat % len(keys)]:
            if key in failed:
                continue
            try:
                us, trajectory, *peak = runs[key]()
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                failed[key] = (str(e).splitlines() or [type(e).__name__])[0][:200]
                continue
            times[key].append(us)
            losses.setdefault(key, trajectory)
            if peaks is not None and peak and peak[0] is not None:
                peaks[key] = max(peaks.get(key, 0.0), peak[0])
    return times, losses, failed


def summary(times, failed):
    """(condition, framework, median, min, max, error) for each (condition, framework) key."""
    return [(*key, None, None, None, failed[key]) if key in failed else
            (*key, statistics.median(values), min(values), max(values), None) for key, values in times.items()]


def max_difference(reference, losses):
    return max(abs(a - b) for a, b in zip(reference, losses)) if losses else float("nan")


def table(rows, column, extra=()):
    """Markdown lines: median µs/step, min-max, the `extra` columns ((title, row -> text) pairs, for the rows
    that ran) and the median over fulgur's at the same condition."""
    titles = "".join(f" {title} |" for title, _ in extra)
    lines = [f"| {column} | framework | median µs/step | min–max |{titles} vs fulgur |",
             f"|---|---|---:|---:|{'---:|' * len(extra)}---:|"]
    for row in rows:
        condition, name, median, low, high, error = row
        if error:
            lines.append(f"| {condition} | {name} | — | — |{' — |' * len(extra)} failed: {error} |")
            continue
        fulgur = next((r[2] for r in rows if r[0] == condition and r[1] == "fulgur" and r[2]), None)
        versus = f"{median / fulgur:.2f}x" if fulgur else "—"
        cells = "".join(f" {cell(row)} |" for _, cell in extra)
        lines.append(f"| {condition} | {name} | {median:.1f} | {low:.1f}–{high:.1f} |{cells} {versus} |")
    return lines


def machine():
    return (f"{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
            f"{torch.__version__}, lightning {L.__version__}")


def figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(10, 4.5))


def save(fig, ax, path, title, ylabel):
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(textwrap.wrap(title.split(" (")[0], 150)), fontsize=8)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def plot(rows, path, title, ylabel="µs per training step (median, min-max)"):
    measured = [r for r in rows if r[2] is not None]
    precisions = list(dict.fromkeys(r[0] for r in measured))
    names = list(dict.fromkeys(r[1] for r in measured))
    width = 0.8 / len(names)
    fig, ax = figure()
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
    save(fig, ax, path, title, ylabel)


def plot_scaling(rows, path, title):
    """Samples/s against ranks, one line a framework (min-max as error bars), and fulgur's 1-rank rate x ranks."""
    fig, ax = figure()
    for name in dict.fromkeys(r[1] for r in rows if r[2] is not None):
        points = [(r[0], *(r[0] * DDP_BATCH * 1e6 / t for t in r[2:5])) for r in rows if r[1] == name and r[2]]
        ranks, rate, fastest, slowest = zip(*points)
        ax.errorbar(ranks, rate, yerr=[[r - s for r, s in zip(rate, slowest)], [f - r for r, f in zip(rate, fastest)]],
                    marker="o", capsize=3, label=name)
        if name == "fulgur" and ranks[0] == 1:
            ax.plot(ranks, [rate[0] * r for r in ranks], "--", color="grey", label="fulgur's 1-rank rate x ranks")
    ranks = sorted({r[0] for r in rows})
    ax.set_xticks(ranks, [str(r) for r in ranks])
    ax.set_xlabel(f"ranks ({DDP_BATCH} samples each a step)")
    ax.set_ylim(bottom=0)
    save(fig, ax, path, title, "samples/s (median, min-max)")


def publish(args, key, header, lines, notes, draw, problems, failed, record):
    """Prints the report and, with --check, the problems; writes `record` (with the report and the problems) to
    --json; then, unless a run failed (failed: how many) or --check found a problem, writes the report between
    the "compare.py KEY" markers of --docs and draws --plot. Returns the exit status: 1 when a run failed or
    --check found a problem."""
    text = "\n".join([header, "", *lines, "", "Loss trajectories (first repetition):", "", *[f"- {n}" for n in notes]])
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**record, "report": text, "problems": problems, "failed_runs": failed}, f, indent=1)
        print(f"wrote {args.json}")
    if args.check or failed:
        for p in problems if args.check else [p for p in problems if " failed: " in p]:
            print("PROBLEM:", p)
    if args.check:
        print("same trajectories" if not problems else f"{len(problems)} problems")
    if failed or (args.check and problems):
        why = f"{failed} run{'s' if failed > 1 else ''} failed" if failed else "--check found problems"
        targets = [t for t in (f"--docs {args.docs}" if args.docs else "",
                               "--plot" if args.plot is not None else "") if t]
        print(f"{why}: " + (f"nothing written ({' and '.join(targets)} left untouched)" if targets
                            else "exit status 1"), file=sys.stderr)
        return 1
    if args.docs:
        with open(args.docs, encoding="utf-8") as f:
            doc = f.read()
        begin, end = markers(key)  # checked before the run; checked again in case the file changed since
        if begin in doc and end in doc:
            doc = doc[:doc.index(begin) + len(begin)] + "\n" + text + "\n" + doc[doc.index(end):]
            with open(args.docs, "w", encoding="utf-8") as f:
                f.write(doc)
            print(f"wrote the {key} section of {args.docs}")
        else:
            print(f"{args.docs} no longer has the {begin} ... {end} markers; nothing written", file=sys.stderr)
            return 1
    if args.plot is not None:
        images = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "images")
        gpu = f"compare_gpu_{'gpt' if MODEL.startswith('gpt') else MODEL}.png"
        draw(args.plot or os.path.normpath(os.path.join(images, {"mlp": "compare_cpu.png", "gpu": gpu}.get(
            key, f"compare_cpu_{key}.png"))))
    return 0


def work(init, x):
    """(items a step, their unit, model FLOPs an item, a description) of MODEL, from its initial weights and one
    batch's input: the MLP's samples at 6 N FLOPs, or the GPT's tokens at 6 N + 12 L T d (see GPU above)."""
    if MODEL == "mlp":
        n = sum(t.numel() for t in init.values())
        return x.size(0), "samples", 6 * n, f"{n:,} parameters, 6 N FLOPs a sample"
    n = sum(t.numel() for key, t in init.items() if key not in ("tokens.weight", "positions"))
    layers = sum(1 for key in init if key.startswith("block") and key.endswith(".ln1.weight"))
    context, width = x.size(1), init["positions"].size(1)
    flops = 6 * n + 12 * layers * context * width
    heads = SHAPE["heads"] if MODEL == "gpt-large" else 4
    return x.numel(), "tokens", flops, (f"{layers} block{'s' * (layers != 1)}, width {width}, {heads} "
                                         f"head{'s' * (heads != 1)}, {init['head.weight'].size(0)}"
                                         f"-token vocabulary, {x.size(0)} x {context} tokens a step, {n / 1e6:.1f}M non-embedding "
                                         f"parameters, {flops / 1e9:.3g} GFLOP a token (6 N + 12 L T d)")


def release():
    """Frees what a finished Python run left on the GPU (the next run, maybe a C++ worker, gets it back)."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def timed(run, device, warmup, steps):
    """(µs a step over steps warmup.., losses, the CUDA allocator's peak MiB or None) of run(window)."""
    cuda = device == "cuda"
    window = Window(warmup, steps - 1, torch.cuda.synchronize if cuda else lambda: None)
    release()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        _, losses = run(window)
        return window.step_us(), losses, torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    finally:
        release()


def compare_single(args, folder):
    torch.manual_seed(0)
    init = MODELS[MODEL][0]().state_dict()
    batches = [MODELS[MODEL][2]() for _ in range(args.steps)]
    xs, ys = [b[0] for b in batches], [b[1] for b in batches]
    torch.save(init, os.path.join(folder, "init.pt"))
    torch.save({"x": torch.stack(xs), "y": torch.stack(ys)}, os.path.join(folder, "data.pt"))
    device, key = args.device, section(args)

    if args.windowed:  # the steps from --warmup on, between device synchronizations (GPU above)
        options = [f"--device={device}", f"--warmup={args.warmup}"]
        if MODEL == "gpt-large":
            options += [f"--{name}={SHAPE[name]}" for name in ("layers", "width", "heads", "context", "vocab")]

        def python(run, **kwargs):
            return lambda p: timed(lambda w: run(p, init, xs, ys, window=w, device=device, **kwargs), device,
                                   args.warmup, args.steps)

        frameworks = {"raw PyTorch": python(raw_pytorch), "Lightning Fabric": python(fabric)}
        if device == "cpu":  # on a GPU: Fabric stands for Lightning (time: see GPU above)
            frameworks.update({"Lightning Trainer": python(trainer),
                               "Lightning Trainer + bar + CSV": python(trainer, logged=True)})
        frameworks.update({"raw LibTorch": lambda p: cpp(args.worker, "libtorch", p, folder, options),
                           "fulgur": lambda p: cpp(args.worker, "fulgur", p, folder, options)})
    else:
        def per_step(run):
            seconds, losses = run()
            return seconds / args.steps * 1e6, losses

        frameworks = {name: (lambda run: lambda p: per_step(lambda: run(p)))(run) for name, run in {
            "raw PyTorch": lambda p: raw_pytorch(p, init, xs, ys),
            "Lightning Fabric": lambda p: fabric(p, init, xs, ys),
            "Lightning Trainer": lambda p: trainer(p, init, xs, ys),
            "Lightning Trainer + bar + CSV": lambda p: trainer(p, init, xs, ys, logged=True),
            "raw LibTorch": lambda p: cpp(args.worker, "libtorch", p, folder),
            "fulgur": lambda p: cpp(args.worker, "fulgur", p, folder),
        }.items()}

    rows, notes, problems, failures, peaks, trajectories = [], [], [], [], {}, {}
    for precision in args.precisions:
        runs = {(precision, name): (lambda f=f: f(precision)) for name, f in frameworks.items()}
        times, losses, failed = interleaved(runs, args.repeats, warm_up=not args.windowed, peaks=peaks)
        failures.append(failed)
        trajectories.update(losses)
        problems.extend(f"{precision}: {name} failed: {error}" for (_, name), error in failed.items())
        reference = losses.get((precision, "raw PyTorch"))
        for name in frameworks:
            if (precision, name) in failed or reference is None:
                continue
            trajectory = losses[(precision, name)]
            diff = max_difference(reference, trajectory)
            # On the CPU Lightning runs '16-mixed' as bf16 (below)
            lightning_fp16 = precision == "16-mixed" and name.startswith("Lightning") and device == "cpu"
            # Fabric's '-true' precisions hand the model's output (the logits) back in float32, so its loss is
            # computed in float32 where raw PyTorch's is in the precision's dtype
            fabric_true = precision in ("bf16-true", "16-true") and name == "Lightning Fabric"
            # The GPT's AdamW: LibTorch's arithmetic (mul + add) is not PyTorch's (lerp), so C++ and
            # Python part at the last bit from the first step on; only the MLP's SGD is the same op for op.
            libtorch_adamw = MODEL != "mlp" and name in ("raw LibTorch", "fulgur")
            exempt = lightning_fp16 or fabric_true or libtorch_adamw
            if not (diff == 0 and len(trajectory) == len(reference)) and not exempt:
                problems.append(f"{precision}: {name} differs from raw PyTorch (max {diff:.3g})")
            libtorch = losses.get((precision, "raw LibTorch"))
            if name == "fulgur" and libtorch is not None and libtorch != trajectory:
                problems.append(f"{precision}: fulgur differs from raw LibTorch")
            notes.append(f"{precision}: {name}: {len(trajectory)} losses, max |loss - raw PyTorch's| = {diff:.3g}")
        rows.extend(summary(times, failed))

    if MODEL != "mlp":
        notes.append("raw LibTorch and fulgur step with LibTorch's AdamW, whose arithmetic (mul + add) differs from "
                     "PyTorch's (lerp) in the last bit: their losses part from Python's from the second step on; "
                     "fulgur's equal raw LibTorch's exactly")
    if "16-mixed" in args.precisions and device == "cpu":  # Lightning's connector: "AMP with fp16 is not supported on CPU"
        notes.append("16-mixed: Lightning Fabric and Trainer replace '16-mixed' on the CPU by 'bf16-mixed' (with a "
                     "warning), so their 16-mixed rows run bfloat16 autocast without a scaler; raw PyTorch, raw "
                     "LibTorch and fulgur run float16 autocast with a GradScaler")
    if any(p in args.precisions for p in ("bf16-true", "16-true")):
        notes.append("-true precisions: Lightning Fabric converts the model's output (the logits) to float32 before "
                     "the loss; raw PyTorch, raw LibTorch and fulgur compute the loss in the precision's dtype")
    record = {"model": MODEL, "device": device, "steps": args.steps, "repeats": args.repeats,
              "rows": [dict(zip(("precision", "framework", "median_us", "min_us", "max_us", "error"), r)) for r in rows],
              "peak_mib": {" / ".join(k): v for k, v in peaks.items()},
              "losses": {" / ".join(k): v for k, v in trajectories.items()}}
    if not args.windowed:
        header = (f"{MODEL}: {machine()}, 1 thread, {args.steps} steps x {args.repeats} interleaved repetitions (the "
                  f"\"vs fulgur\" column: its median step time over fulgur's).")
        return publish(args, key, header, table(rows, "precision"), notes, lambda path: plot(rows, path, header),
                       problems, sum(len(f) for f in failures), record)

    items, unit, flops, described = work(init, xs[0])
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else None
    tf32 = device == "cuda" and torch.backends.cuda.matmul.allow_tf32
    reasons = {}

    def peak_of(precision):
        if args.peak_tflops:
            return args.peak_tflops
        peak, why = peak_tflops(gpu, precision, tf32)
        if why:
            reasons[why] = None
        return peak

    def mfu(row):
        peak = peak_of(row[0])
        return f"{flops * items / row[2] * 1e6 / (peak * 1e12):.1%}" if peak else "n/a"

    lines = table(rows, "precision", [
        (f"{unit}/s", lambda row: f"{items / row[2] * 1e6:,.0f}"), ("MFU", mfu),
        ("peak GiB", lambda row: f"{peaks[row[:2]] / 1024:.2f}" if row[:2] in peaks else "—")])
    lines += [f"\nMFU n/a: {why}" for why in reasons]
    if args.peak_tflops:
        against = f"MFU against --peak-tflops {args.peak_tflops:g}"
    elif any(peak_of(p) for p in args.precisions):
        against = "MFU against " + ", ".join(f"{p} {peak_of(p) or 'n/a'}" for p in args.precisions) + " TFLOP/s"
    else:
        against = "MFU n/a (below)"
    where = (f"{gpu}, CUDA {torch.version.cuda}, TF32 matmuls {'on' if tf32 else 'off'}" if gpu else "the CPU, 1 thread")
    header = (f"{key}: {MODEL} on {where}: {described}; {machine()}; {args.steps} steps, the first {args.warmup} "
              f"untimed (the clock read after a device synchronization before and after the timed steps), x "
              f"{args.repeats} interleaved repetitions; {against} (\"vs fulgur\": the median step time over fulgur's).")
    record.update(header=header, unit=unit, items_per_step=items, flops_per_item=flops, gpu=gpu, tf32=tf32,
                  shape=SHAPE if MODEL == "gpt-large" else None, warmup=args.warmup)

    def draw(path):
        rates = [(c, n, items / m * 1e6, items / high * 1e6, items / low * 1e6, e) if m else (c, n, m, low, high, e)
                 for c, n, m, low, high, e in rows]
        plot(rates, path, header, f"{unit}/s (median, min-max)")

    return publish(args, key, header, lines, notes, draw, problems, sum(len(f) for f in failures), record)


def compare_ddp(args, folder):  # parse_args checked 0 <= --warmup < --steps
    torch.manual_seed(0)
    init = MODELS["mlp"][0]().state_dict()
    # Step s's global batch: one 64-sample batch per rank of the largest world, rank r's in rows 64r..64r+63.
    batches = [[MODELS["mlp"][2]() for _ in range(max(args.ranks))] for _ in range(args.steps)]
    torch.save(init, os.path.join(folder, "init.pt"))
    torch.save({"x": torch.stack([torch.cat([b[0] for b in step]) for step in batches]),
                "y": torch.stack([torch.cat([b[1] for b in step]) for step in batches])},
               os.path.join(folder, "data.pt"))

    commands = ddp_commands(args.worker, folder, args.warmup)

    def run(command):
        result = last_json(command)
        return result["step_us"], result["losses"]

    runs = {(ranks, name): (lambda c=command(ranks): run(c)) for ranks in args.ranks for name, command in commands.items()}
    times, losses, failed = interleaved(runs, args.repeats, warm_up=False)  # warm-up: inside each run
    notes, problems = [], []
    for ranks in args.ranks:
        reference = losses.get((ranks, "torch DDP"))
        where = f"{ranks} rank{'s' if ranks > 1 else ''}"
        for name in commands:
            if (ranks, name) in failed:
                problems.append(f"{where}: {name} failed: {failed[(ranks, name)]}")
                continue
            if reference is None:
                continue
            trajectory = losses[(ranks, name)]
            diff = max_difference(reference, trajectory)
            if not (diff <= DDP_TOLERANCE and len(trajectory) == args.steps):
                problems.append(f"{where}: {name} differs from torch DDP (max {diff:.3g}, {len(trajectory)} "
                                f"losses; tolerance {DDP_TOLERANCE:g})")
            notes.append(f"{where}: {name}: {len(trajectory)} losses of rank 0, "
                         f"max |loss - torch DDP's| = {diff:.3g}")
    rows = summary(times, failed)
    lines = table(rows, "ranks", [("samples/s", lambda row: f"{row[0] * DDP_BATCH / row[2] * 1e6:,.0f}")])
    if len(args.ranks) > 1:
        low, high = min(args.ranks), max(args.ranks)
        scaling = []
        for name in commands:
            if times[(low, name)] and times[(high, name)]:
                speedup = statistics.median(times[(low, name)]) / statistics.median(times[(high, name)]) * high / low
                scaling.append(f"{name} {speedup:.2f}")
        lines += ["", f"Samples/s at {high} ranks over {low} rank{'s' if low > 1 else ''}'s (ideal {high / low:g}): "
                  + ", ".join(scaling) + "."]
    if os.cpu_count() <= max(args.ranks):
        notes.append(f"the {max(args.ranks)} ranks share this machine's {os.cpu_count()} cores with Gloo's threads "
                     f"and the launchers")
    notes.append(f"the check allows max |difference| <= {DDP_TOLERANCE:g}")
    header = (f"ddp: {machine()}, Gloo, 1 intra-op thread per rank, {DDP_BATCH} samples per rank a step, "
              f"{args.steps} steps (the first {args.warmup} untimed) x {args.repeats} interleaved repetitions (step "
              f"time between barriers inside the ranks; \"vs fulgur\": its median step time over fulgur's at the same "
              f"number of ranks).")
    record = {"ranks": args.ranks, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
              "rows": [dict(zip(("ranks", "framework", "median_us", "min_us", "max_us", "error"), r)) for r in rows],
              "losses": {f"{r} / {n}": v for (r, n), v in losses.items()}}
    return publish(args, "ddp", header, lines, notes, lambda path: plot_scaling(rows, path, header), problems,
                   len(failed), record)


def main(args):
    global MODEL
    MODEL = args.model
    SHAPE.update(args.shape)
    if args.device == "cuda" and not torch.cuda.is_available():  # the worker saw one (parse_args); this torch not
        print(f"compare.py: --device cuda: this Python's torch sees no CUDA device (torch.cuda.is_available() is false; "
              f"torch {torch.__version__}, built with CUDA {torch.version.cuda}); nothing ran", file=sys.stderr)
        return 2
    # SIGTERM (a CI job's timeout) unwinds like Ctrl-C: the running child is killed, the folder removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="fulgur-compare-", ignore_cleanup_errors=True) as folder:
        return (compare_ddp if args.ddp else compare_single)(args, folder)


if __name__ == "__main__":
    sys.exit(main(ARGS))
