"""Loader throughput: fulgur's DataLoader against PyTorch's DataLoader and LibTorch's torch::data.

    python bench/loader/loader.py --worker build/bench/bench_loader_worker [--images 8192] [--batch 64]
        [--batches 100] [--workers 0 1 2] [--repeats 3] [--docs docs/benchmarks.md] [--plot [PNG]] [--smoke]

The same data and per-sample work for all: a .npy of uint8 images N x 3 x 64 x 64 (written here with
numpy, then read from the page cache), a random 56 x 56 crop, a horizontal flip half the time, to
float, normalised per channel, shuffled batches of --batch. Each configuration runs in a process of
its own, times --batches batches after one warm-up batch (worker start-up left out) and reports
samples/s; the configurations are interleaved and their order rotates each repetition; the table
gives the median and the ratios at the same worker count. One intra-op thread per process:

    fulgur          fulgur::data::DataLoader, num_workers threads (bench/loader/worker.cpp)
    PyTorch         torch.utils.data.DataLoader, num_workers processes, pin_memory off and on
    torch::data     LibTorch's make_data_loader with a RandomSampler and Stack, workers threads

--docs replaces the section between the "loader.py:begin" / "loader.py:end" markers; --plot draws
samples/s against workers (default docs/images/loader_throughput.png). --smoke runs a tiny size once
and checks that every configuration ran (ctest's bench.loader.smoke).
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def pytorch_child(npy, workers, batch, batches, pin):
    """Runs in its own process: PyTorch's DataLoader over the .npy, prints samples_per_s."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1) * 255
    inv_std = 1 / (torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1) * 255)

    class Images(torch.utils.data.Dataset):
        def __init__(self):
            self.images = None
            self.length = np.load(npy, mmap_mode="r").shape[0]

        def __len__(self):
            return self.length

        def __getitem__(self, i):
            if self.images is None:  # opened in each worker process
                self.images = np.load(npy, mmap_mode="r")
            image = torch.from_numpy(np.array(self.images[i]))
            room = image.shape[1] - 56 + 1
            dy, dx, flip = torch.randint(0, 1 << 30, (3,)).tolist()
            crop = image[:, dy % room:dy % room + 56, dx % room:dx % room + 56]
            if flip % 2:
                crop = crop.flip(2)
            return (crop.float() - mean) * inv_std, i % 10

    loader = torch.utils.data.DataLoader(Images(), batch_size=batch, shuffle=True, num_workers=workers,
                                         pin_memory=pin)
    it = iter(loader)
    checksum = next(it)[0].sum().item()
    start = time.perf_counter()
    for _ in range(batches):
        checksum += next(it)[0].sum().item()
    seconds = time.perf_counter() - start
    print(f"samples_per_s={batches * batch / seconds:.1f} checksum={checksum:.6g}", flush=True)


def run(command):
    """samples/s of one configuration's process, or the reason it failed."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    for line in done.stdout.splitlines():
        if line.startswith("samples_per_s="):
            return float(line.split()[0].split("=")[1]), None
    return None, (done.stderr.strip().splitlines() or ["no output"])[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", required=True, help="build/bench/bench_loader_worker")
    parser.add_argument("--images", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--docs")
    parser.add_argument("--plot", nargs="?", const=os.path.join(HERE, "..", "..", "docs", "images", "loader_throughput.png"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--pytorch-child", nargs=5, metavar=("NPY", "WORKERS", "BATCH", "BATCHES", "PIN"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pytorch_child:
        npy, workers, batch, batches, pin = args.pytorch_child
        return pytorch_child(npy, int(workers), int(batch), int(batches), pin == "1")
    if args.smoke:
        args.images, args.batch, args.batches, args.workers, args.repeats = 96, 8, 4, [0, 2], 1
    if not os.access(args.worker, os.X_OK):
        sys.exit(f"loader.py: --worker {args.worker} is not an executable (build bench_loader_worker first)")
    if (args.batches + 1) * args.batch > args.images:
        sys.exit("loader.py: --images must hold (--batches + 1) x --batch images")
    if args.docs:
        text = open(args.docs).read()
        if "<!-- loader.py:begin -->" not in text or "<!-- loader.py:end -->" not in text:
            sys.exit(f"loader.py: --docs {args.docs} has no loader.py:begin/end markers; nothing would be written")

    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        npy = os.path.join(folder, "images.npy")
        np.save(npy, np.random.default_rng(0).integers(0, 256, (args.images, 3, 64, 64), dtype=np.uint8))
        configs = []
        for w in args.workers:
            size = ["--batch", str(args.batch), "--batches", str(args.batches)]
            configs.append((("fulgur", w), [args.worker, "--npy", npy, "--loader", "fulgur", "--workers", str(w)] + size))
            configs.append((("torch::data", w), [args.worker, "--npy", npy, "--loader", "torch_data", "--workers", str(w)] + size))
            for pin in (0, 1):
                configs.append(((f"PyTorch{' pin_memory' if pin else ''}", w),
                                [sys.executable, __file__, "--worker", args.worker, "--pytorch-child", npy, str(w),
                                 str(args.batch), str(args.batches), str(pin)]))
        results, failures = {}, {}
        for repeat in range(args.repeats):
            shift = repeat % len(configs)
            for key, command in configs[shift:] + configs[:shift]:
                value, error = run(command)
                if value is None:
                    failures[key] = error
                else:
                    results.setdefault(key, []).append(value)
    return report(args, results, failures)


def report(args, results, failures):
    median = {key: statistics.median(values) for key, values in results.items()}
    names = ["fulgur", "PyTorch", "PyTorch pin_memory", "torch::data"]
    lines = [f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}; "
             f"{args.images} images 3x64x64 uint8, batch {args.batch}, {args.batches} timed batches, median of "
             f"{args.repeats} (samples/s, higher is better)", "",
             "| workers | " + " | ".join(names) + " | fulgur / PyTorch | fulgur / torch::data |",
             "| ---: |" + " ---: |" * (len(names) + 2)]
    for w in args.workers:
        cells = [f"{median[(n, w)]:,.0f}" if (n, w) in median else "failed" for n in names]
        ratio = lambda other: f"**{median[('fulgur', w)] / median[(other, w)]:.2f}**" \
            if ("fulgur", w) in median and (other, w) in median else "-"
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {ratio('PyTorch')} | {ratio('torch::data')} |")
    for key, error in failures.items():
        lines.append(f"\n{key[0]} with {key[1]} workers failed: {error}")
    table = "\n".join(lines)
    print(table)
    if failures:
        return 1
    if args.docs:
        text = open(args.docs).read()
        begin, end = "<!-- loader.py:begin -->", "<!-- loader.py:end -->"
        head, rest = text.split(begin, 1)
        open(args.docs, "w").write(head + begin + "\n" + table + "\n" + end + rest.split(end, 1)[1])
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        figure, axes = plt.subplots(figsize=(6, 3.6))
        for name in names:
            xs = [w for w in args.workers if (name, w) in median]
            axes.plot(xs, [median[(name, w)] for w in xs], marker="o", label=name)
        axes.set_xlabel("workers")
        axes.set_ylabel("samples / s")
        axes.set_xticks(args.workers)
        axes.set_title("Loader throughput: crop, flip, normalise 3x64x64 images")
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(args.plot, dpi=110)
    if args.smoke:
        print("loader.py smoke: every configuration ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
