"""ctest bench.compare.bad_arguments: compare.py and bench_compare_worker refuse bad arguments at once.

    python bench/compare/check_arguments.py COMPARE_PY WORKER

Each bad command must exit non-zero within SECONDS with its message, before anything trains (compare.py
checks its arguments, --docs, --plot and --worker before it imports torch); --help must answer as fast.
compare.py runs with TMPDIR set to a fresh folder, which must stay empty (no fulgur-compare-* left).
The worker must answer a bad mode, model, option or DIR with one "bench_compare_worker: why" line and exit
status 2, never an abort. Where the worker sees no CUDA device (`bench_compare_worker --cuda` exits 2), --device
cuda must stop at once with "no CUDA device" (scripts/gpu_bench.sh's clear failure); on a GPU machine those
checks are left out (and counted as such). Prints "compare.py argument checks: all N passed" or each failure (exit status 1).
"""
import os
import subprocess
import sys
import tempfile
import time

SECONDS = 5.0  # a bad argument answers in ~0.1 s (the worker's --probe: ~1 s); torch's import alone takes longer


def run(command, env=None):
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    return done, time.perf_counter() - start


def main():
    compare, worker = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    failures, checks, skipped = [], 0, []

    def expect(what, command, status, message, env=None):
        nonlocal checks
        checks += 1
        done, seconds = run(command, env)
        output = done.stdout + done.stderr
        problems = []
        if status == "nonzero" and done.returncode == 0 or status != "nonzero" and done.returncode != status:
            problems.append(f"exit status {done.returncode}, expected {status}")
        if message not in output:
            problems.append(f"no {message!r} in its output")
        if seconds > SECONDS:
            problems.append(f"took {seconds:.1f} s (at most {SECONDS:g})")
        if problems:
            tail = "\n    ".join(output.strip().splitlines()[-4:])
            failures.append(f"{what}: {'; '.join(problems)}\n    {tail}")

    has_cuda = subprocess.run([worker, "--cuda"], capture_output=True, timeout=60).returncode == 0
    with tempfile.TemporaryDirectory() as scratch:
        private_tmp = os.path.join(scratch, "tmp")
        os.mkdir(private_tmp)
        env = dict(os.environ, TMPDIR=private_tmp)
        python = [sys.executable, compare]
        ok = ["--worker", worker]
        bad_worker = "is not bench_compare_worker"
        hint = "cmake --build build --target bench_compare_worker"
        no_markers = os.path.join(scratch, "no_markers.md")
        with open(no_markers, "w") as f:
            f.write("# notes\n\n<!-- compare.py mlp:begin -->\n<!-- compare.py mlp:end -->\n")
        not_executable = os.path.join(scratch, "worker.txt")
        with open(not_executable, "w") as f:
            f.write("not a program\n")

        expect("--help", [*python, "--help"], 0, "usage: compare.py", env)
        cases = [
            ("unknown precision", ["--precisions", "fp8-magic"], "argument --precisions: invalid choice: 'fp8-magic'"),
            ("unknown model", ["--model", "gtp"], "argument --model: invalid choice: 'gtp'"),
            ("--steps 0", ["--steps", "0"], "argument --steps: must be a whole number >= 1"),
            ("negative --steps", ["--steps", "-5"], "argument --steps: must be a whole number >= 1"),
            ("--repeats 0", ["--repeats", "0"], "argument --repeats: must be a whole number >= 1"),
            ("--ranks 0", ["--ddp", "--ranks", "0"], "argument --ranks: must be a whole number >= 1"),
            ("--ddp --warmup >= --steps", ["--ddp", "--steps", "10", "--warmup", "10"],
             "--warmup (10) must be below --steps (10)"),
            ("--ddp with --precisions", ["--ddp", "--precisions", "bf16-mixed"], "--ddp runs 32-true only"),
            ("--ddp --model gpt", ["--ddp", "--model", "gpt"], "--ddp runs the MLP only"),
            ("missing --docs", ["--docs", os.path.join(scratch, "missing.md")], "missing.md: no such file"),
            ("--docs without the section's markers", ["--ddp", "--docs", no_markers],
             "has no <!-- compare.py ddp:begin --> ... <!-- compare.py ddp:end --> markers"),
            ("--plot into a missing folder", ["--plot", os.path.join(scratch, "missing", "x.png")], "does not exist"),
            ("unknown device", ["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
            ("--ddp --device cuda", ["--ddp", "--device", "cuda"], "--ddp runs on the CPU over Gloo"),
            ("--layers without gpt-large", ["--model", "gpt", "--layers", "4"], "--layers sets gpt-large's shape"),
            ("--width not a multiple of --heads", ["--model", "gpt-large", "--width", "100", "--heads", "3"],
             "--width (100) must be a multiple of --heads (3)"),
            ("--context 0", ["--model", "gpt-large", "--context", "0"], "argument --context: must be a whole number"),
            ("--peak-tflops 0", ["--peak-tflops", "0"], "argument --peak-tflops: must be a number > 0"),
            ("--warmup >= --steps", ["--model", "gpt-large", "--steps", "3", "--warmup", "3"],
             "--warmup (3) must be below --steps (3)"),
            ("--json into a missing folder", ["--json", os.path.join(scratch, "missing", "x.json")], "does not exist"),
        ]
        if not has_cuda:  # the GPU benchmark's command here: a clear message, nothing run
            cases += [("--device cuda without CUDA", ["--device", "cuda", "--model", "gpt-large"],
                       "--device cuda: no CUDA device here"),
                      ("--device cuda without CUDA (what)", ["--device", "cuda"], "torch::cuda::is_available() is false")]
        else:
            skipped.append("--device cuda without CUDA (this machine has a CUDA device)")
        for what, arguments, message in cases:
            expect(what, [*python, *ok, *arguments], 2, message, env)
        for what, path, why in [("missing worker", os.path.join(scratch, "missing"), "no such file"),
                                ("worker is a directory", scratch, "a directory"),
                                ("worker is /bin/true", "/bin/true", "`--probe` answered exit status 0"),
                                ("worker is another program", sys.executable, "`--probe` answered exit status 2"),
                                ("worker is a text file", not_executable, "not executable")]:
            expect(what, [*python, "--worker", path], 2, f"--worker {path} {bad_worker} ({why}", env)
            expect(what + " (hint)", [*python, "--worker", path], 2, hint, env)
        expect("a good worker, bad steps", [*python, *ok, "--steps", "x"], 2, "must be a whole number >= 1, not 'x'",
               env)
        left = os.listdir(private_tmp)
        checks += 1
        if left:
            failures.append(f"compare.py left {left} in TMPDIR")

        expect("worker --probe", [worker, "--probe"], 0, "bench_compare_worker fulgur libtorch fulgur-ddp libtorch-ddp")
        expect("worker without arguments", [worker], 2, "bench_compare_worker: no mode given")
        expect("worker, unknown mode", [worker, "train", "32-true", scratch], 2, "bench_compare_worker: unknown mode")
        expect("worker, unknown model", [worker, "fulgur", "32-true", scratch, "gtp"], 2,
               "bench_compare_worker: unknown model 'gtp'")
        expect("worker, missing files", [worker, "libtorch", "32-true", scratch], 2, "bench_compare_worker: ")
        expect("worker, missing files (what)", [worker, "fulgur", "bf16-mixed", scratch], 2, "init.pt")
        expect("worker ddp, bad RANKS", [worker, "fulgur-ddp", "two", scratch, "1"], 2,
               "bench_compare_worker: RANKS must be a whole number")
        expect("worker ddp, missing files", [worker, "libtorch-ddp", "1", scratch, "1"], 2, "bench_compare_worker: ")
        expect("worker --probe names gpt-large", [worker, "--probe"], 0, " gpt-large")
        expect("worker, unknown option", [worker, "fulgur", "32-true", scratch, "gpt-large", "--colour=red"], 2,
               "bench_compare_worker: unknown option '--colour=red'")
        expect("worker, unknown device", [worker, "fulgur", "32-true", scratch, "gpt", "--device=tpu"], 2,
               "bench_compare_worker: unknown device 'tpu'")
        expect("worker, shape of the small gpt", [worker, "fulgur", "32-true", scratch, "gpt", "--layers=4"], 2,
               "bench_compare_worker: --layers sets gpt-large's shape, not gpt's")
        expect("worker, bad --warmup", [worker, "libtorch", "32-true", scratch, "gpt-large", "--warmup=x"], 2,
               "bench_compare_worker: --warmup takes a whole number >= 0, not 'x'")
        expect("worker, --width not a multiple of --heads",
               [worker, "libtorch", "32-true", scratch, "gpt-large", "--width=100", "--heads=3"], 2,
               "bench_compare_worker: --width=100 is not a multiple of --heads=3")
        if not has_cuda:
            expect("worker --cuda without CUDA", [worker, "--cuda"], 2, "bench_compare_worker: no CUDA device")
            expect("worker --device=cuda without CUDA",
                   [worker, "fulgur", "bf16-mixed", scratch, "gpt-large", "--device=cuda", "--warmup=1"], 2,
                   "bench_compare_worker: --device=cuda: no CUDA device")
        else:
            skipped.append("worker --cuda and --device=cuda without CUDA (this machine has a CUDA device)")

    for failure in failures:
        print("FAILED:", failure)
    if failures:
        print(f"compare.py argument checks: {len(failures)} of {checks} failed")
        return 1
    for what in skipped:
        print("left out:", what)
    print(f"compare.py argument checks: all {checks} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
