#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (the device tool's, with .carry from scripts/gpu_carry.sh carried):
# builds against that machine's own torch, then
#   tests     every CUDA test (tests/gpu, fulgur_gpu_tests)
#   matrix    the policy matrix's CUDA single-device rows (fulgur beside the hand-written LibTorch loop on the
#             MLP, the CNN and the GPT, in every precision but the CNN's and GPT's 16-true, which diverge (NaN) by
#             design; the CUDA allocator's peak memory), and bench_fused's CUDA rows (fulgur with the fused optimizers
#             beside the hand-written loop with torch::optim's), and bench_pinned_fit (a fit reading host memory
#             through DataLoader{.pin_memory} beside the same fit with the data on the GPU); informative: their
#             exit status does not count
#   compare   bench/compare/compare.py --device cuda --model gpt-large: the GPT at GPT-2-small size (12 x 768,
#             context 1024, 16 sequences a step) in 32-true, 16-mixed, bf16-mixed and bf16-true, for fulgur, raw
#             LibTorch, Lightning Fabric and raw PyTorch: step time, tokens/s, MFU, peak memory
# Results go to $OUT (the device tool's folder) or build-gpu/results: machine.txt, the logs, cuda_tests.txt,
# matrix_cuda.{txt,json}, compare_gpu.{txt,json}, compare_gpu_gpt.png and benchmarks.md (a copy of
# docs/benchmarks.md with its "compare.py gpu" section filled). The exit status: 0 when the CUDA tests and the
# compare run passed, 1 when either failed (or the build did), 2 with the reason where there is no GPU, no
# torch or no .carry (before anything is built).
#   device run: bash scripts/gpu_bench.sh [tests] [matrix] [compare]     (carry: [".carry"]; default: all three)
# FULGUR_PART_TIMEOUT: seconds each part may run (timeout(1)), so that one stuck part leaves the others' results.
# FULGUR_COMPARE_ARGS: more compare.py arguments, after the defaults (they win), e.g. "--steps 10 --batch 8".
# Building there takes most of the time; to stay under a 10-minute command, run "tests matrix" and
# "compare" as two commands on the same (warm) machine: the build folder is kept.
# With binaries carried (scripts/gpu_carry.sh --binaries) built against the same torch version as the
# device's, nothing is built: they run with the device's torch libraries (FULGUR_BUILD=always builds anyway);
# on an H100 (2026-11-22) tests + matrix then took 126 s and compare 269 s.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests matrix compare)
for part in "${parts[@]}"; do
  case "$part" in
    tests|matrix|compare) ;;
    *) echo "scripts/gpu_bench.sh: unknown part '$part' (tests, matrix, compare; default: all three)" >&2; exit 2 ;;
  esac
done
wants() { [[ " ${parts[*]} " == *" $1 "* ]]; }
# The project's .venv Python where there is one, else python3; FULGUR_PYTHON names another.
if [ -n "${FULGUR_PYTHON:-}" ]; then
  python=$FULGUR_PYTHON
elif [ -x "$root/.venv/bin/python" ]; then
  python=$root/.venv/bin/python
else
  python=$(command -v python3 || true)
fi
if [ -z "$python" ]; then
  echo "scripts/gpu_bench.sh: no Python found (no $root/.venv/bin/python, no python3 on PATH); set FULGUR_PYTHON." >&2
  exit 2
fi
if ! torch_error=$("$python" -c "import torch" 2>&1); then
  echo "scripts/gpu_bench.sh: torch cannot be imported by $python:" >&2
  echo "$torch_error" | tail -5 >&2
  echo "Install a CUDA build of torch there (scripts/setup.sh), or set FULGUR_PYTHON to a Python that has one." >&2
  exit 2
fi
if ! cuda_report=$("$python" -c "
import sys, torch
print('torch', torch.__version__, 'built with CUDA', torch.version.cuda)
sys.exit(0 if torch.cuda.is_available() else 1)" 2>&1); then
  echo "scripts/gpu_bench.sh: torch imports in $python but has no CUDA device (torch.cuda.is_available() is false):" >&2
  echo "$cuda_report" | tail -5 >&2
  echo "Run it on a machine with an NVIDIA GPU and a CUDA build of torch (a CPU-only build reports 'built with CUDA None')." >&2
  exit 2
fi
if wants compare && ! lightning_error=$("$python" -c "import lightning" 2>&1); then
  echo "scripts/gpu_bench.sh: the compare part needs Lightning, which $python cannot import:" >&2
  echo "$lightning_error" | tail -3 >&2
  exit 2
fi
carry="${FULGUR_CARRY:-$root/.carry}"
if [ ! -d "$carry" ]; then
  echo "scripts/gpu_bench.sh: no $carry; run scripts/gpu_carry.sh where the Debian packages are, and carry .carry" >&2
  exit 2
fi
build="${FULGUR_BUILD_DIR:-$root/build-gpu}"
out="${OUT:-$build/results}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__)" 2>/dev/null ||
    "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  date -u
} | tee "$out/machine.txt"
gpu_tests=$build/tests/fulgur_gpu_tests matrix=$build/bench/bench_matrix worker=$build/bench/bench_compare_worker
fused=$build/bench/bench_fused pinned_fit=$build/bench/bench_pinned_fit
device_torch=$("$python" -c "import torch; print(torch.__version__)")
if [ "${FULGUR_BUILD:-}" != always ] && [ -f "$carry/bin/torch_version" ] &&
   [ "$(cat "$carry/bin/torch_version")" = "$device_torch" ]; then
  echo "== carried binaries (revision $(tr '\n' ' ' <"$carry/bin/revision"), built against torch $device_torch)" | tee -a "$out/machine.txt"
  gpu_tests=$carry/bin/fulgur_gpu_tests matrix=$carry/bin/bench_matrix worker=$carry/bin/bench_compare_worker
  fused=$carry/bin/bench_fused pinned_fit=$carry/bin/bench_pinned_fit
  # The binaries' RUNPATH names the build machine's venv; this torch's libraries come first instead.
  export LD_LIBRARY_PATH="$("$python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"):$LD_LIBRARY_PATH"
else
  [ -f "$carry/bin/torch_version" ] && [ "${FULGUR_BUILD:-}" != always ] &&
    echo "carried binaries were built against torch $(cat "$carry/bin/torch_version"), this machine has $device_torch: building"
  targets=()
  wants tests && targets+=(fulgur_gpu_tests)
  wants matrix && targets+=(bench_matrix bench_fused bench_pinned_fit)
  wants compare && targets+=(bench_compare_worker)
  echo "== build (${targets[*]})"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFULGUR_BENCH_OPTIMIZED=ON -DFULGUR_PYTHON="$python" \
        -DCMAKE_PREFIX_PATH="$carry" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" \
        >"$out/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$out/build.log" | head -60; exit 1; }
  echo "built in ${SECONDS}s"
fi
status=0
if wants tests; then
  echo "== CUDA tests"
  ${FULGUR_PART_TIMEOUT:+timeout $FULGUR_PART_TIMEOUT} "$gpu_tests" 2>&1 | tee "$out/cuda_tests.txt" | tail -15 || { status=1; echo "CUDA tests FAILED"; }
  # NCCL's exit warning means a process group was left without shutdown (it leaks communicators).
  if grep -q "destroy_process_group() was not called" "$out/cuda_tests.txt"; then
    status=1
    echo "CUDA tests: an NCCL process group was not shut down (its exit warning is in cuda_tests.txt)"
  fi
fi
if wants matrix; then
  echo "== policy matrix, CUDA single device (without the CNN's and GPT's 16-true)"
  ${FULGUR_PART_TIMEOUT:+timeout $FULGUR_PART_TIMEOUT} "$matrix" --benchmark_min_time=1 --benchmark_counters_tabular=true \
    --benchmark_filter='^(mlp/cuda/single_device/|(cnn|gpt)/cuda/single_device/(32-true|64-true|16-mixed|bf16-mixed|bf16-true)/)' \
    --benchmark_out="$out/matrix_cuda.json" --benchmark_out_format=json 2>&1 | tee "$out/matrix_cuda.txt" ||
    echo "matrix: a row failed (see 'failed:' in matrix_cuda.txt); not counted in the exit status"
  echo "== fused optimizers against torch::optim's, CUDA single device"
  ${FULGUR_PART_TIMEOUT:+timeout $FULGUR_PART_TIMEOUT} "$fused" --benchmark_min_time=1 --benchmark_counters_tabular=true \
    --benchmark_filter='/cuda/' --benchmark_out="$out/fused_cuda.json" --benchmark_out_format=json 2>&1 |
    tee "$out/fused_cuda.txt" || echo "bench_fused: a row failed (see fused_cuda.txt); not counted in the exit status"
  echo "== a fit over DataLoader{.pin_memory} against the data on the GPU"
  ${FULGUR_PART_TIMEOUT:+timeout $FULGUR_PART_TIMEOUT} "$pinned_fit" --benchmark_counters_tabular=true \
    --benchmark_out="$out/pinned_fit.json" --benchmark_out_format=json 2>&1 |
    tee "$out/pinned_fit.txt" || echo "bench_pinned_fit: a row failed (see pinned_fit.txt); not counted in the exit status"
fi
if wants compare; then
  echo "== compare.py --device cuda --model gpt-large"
  cp "$root/docs/benchmarks.md" "$out/benchmarks.md"
  plot=(--plot "$out/compare_gpu_gpt.png")
  if ! "$python" -c "import matplotlib" 2>/dev/null; then
    plot=()
    echo "(no matplotlib in $python: no compare_gpu_gpt.png)"
  fi
  # shellcheck disable=SC2086  # FULGUR_COMPARE_ARGS: words
  ${FULGUR_PART_TIMEOUT:+timeout $FULGUR_PART_TIMEOUT} "$python" "$root/bench/compare/compare.py" --worker "$worker" --device cuda \
    --model gpt-large --precisions 32-true 16-mixed bf16-mixed bf16-true --steps 25 --warmup 5 --repeats 2 \
    --docs "$out/benchmarks.md" "${plot[@]}" --json "$out/compare_gpu.json" ${FULGUR_COMPARE_ARGS:-} 2>&1 |
    tee "$out/compare_gpu.txt" || { status=1; echo "compare FAILED"; }
fi
echo "done in ${SECONDS}s, exit status $status; results in $out"
exit $status
