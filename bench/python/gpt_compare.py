"""The GPT example side by side with the same model in raw PyTorch (gpt_reference.py): validation loss
at every validation and training tokens/s, on the same train.bin / val.bin, one after the other on an
idle machine. The Python run is repeated with --seeds (different initial weights and batch order) to
show the seed-to-seed noise the fulgur curve is compared against.

    python bench/python/gpt_compare.py --gpt build/examples/gpt --data build/data/gpt
        [--max-steps 1500] [--val-every 250] [--seeds 0 1] [--plot docs/images/gpt_loss_cpu.png]

Prints a markdown table (step, fulgur's val_loss, each seed's, the spread) and tokens/s of both.
"""
import argparse
import csv
import pathlib
import re
import subprocess
import sys
import tempfile

here = pathlib.Path(__file__).resolve().parent


def fulgur_run(args, out):
    command = [args.gpt, "fit", f"--data.dir={args.data}", f"--trainer.default_root_dir={out}",
               f"--trainer.callbacks.dirpath={out}/checkpoints", f"--trainer.max_steps={args.max_steps}",
               f"--model.max_steps={args.max_steps}", f"--trainer.val_check_interval={args.val_every}",
               "--trainer.enable_progress_bar=false"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    tokens_per_second = float(re.search(r"gpt: ([0-9.]+) training tokens/s", done.stdout)[1])
    curve = {}
    with open(next(out.glob("lightning_logs/version_*/metrics.csv"))) as f:
        for row in csv.DictReader(f):
            if row.get("val_loss"):
                curve[int(row["step"]) + 1] = float(row["val_loss"])  # the CSV's step is the 0-based batch
    return curve, tokens_per_second


def python_run(args, seed):
    command = [sys.executable, str(here / "gpt_reference.py"), "--data", args.data, "--max-steps",
               str(args.max_steps), "--val-every", str(args.val_every), "--seed", str(seed)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    curve = {int(m[1]): float(m[2]) for m in re.finditer(r"step (\d+) val_loss ([0-9.]+)", done.stdout)}
    curve.pop(0, None)
    return curve, float(re.search(r"tokens/s ([0-9.]+)", done.stdout)[1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpt", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--val-every", type=int, default=250)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--plot")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        fulgur_curve, fulgur_speed = fulgur_run(args, pathlib.Path(scratch) / "run")
    python = [python_run(args, seed) for seed in args.seeds]

    steps = sorted(fulgur_curve)
    print("| step | fulgur val_loss | " + " | ".join(f"PyTorch seed {s}" for s in args.seeds) +
          " | PyTorch spread | fulgur - PyTorch mean |")
    print("|---:|---:|" + "---:|" * len(args.seeds) + "---:|---:|")
    for step in steps:
        values = [curve.get(step, float("nan")) for curve, _ in python]
        mean = sum(values) / len(values)
        print(f"| {step} | {fulgur_curve[step]:.4f} | " + " | ".join(f"{v:.4f}" for v in values) +
              f" | {max(values) - min(values):.4f} | {fulgur_curve[step] - mean:+.4f} |")
    speeds = [speed for _, speed in python]
    print(f"\ntraining tokens/s: fulgur {fulgur_speed:.0f}, PyTorch " + ", ".join(f"{s:.0f}" for s in speeds) +
          f" (fulgur / PyTorch mean {fulgur_speed / (sum(speeds) / len(speeds)):.3f})")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.8))
        ax.plot(steps, [fulgur_curve[s] for s in steps], "o-", label="fulgur (examples/gpt)")
        for seed, (curve, _) in zip(args.seeds, python):
            ax.plot(sorted(curve), [curve[s] for s in sorted(curve)], "s--", alpha=0.7, label=f"PyTorch, seed {seed}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("validation loss (nats / byte)")
        ax.set_title("Byte-level GPT on Python's documentation, bf16-mixed, 2 CPU cores", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
