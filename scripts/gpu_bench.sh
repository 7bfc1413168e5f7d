#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (the device tool's, with .carry from scripts/gpu_carry.sh carried):
# builds against that machine's own torch, runs every CUDA test, then the policy matrix's CUDA
# single-device rows (fulgur beside the hand-written LibTorch loop on the MLP, the CNN and the GPT, in
# every precision, with the CUDA allocator's peak memory). Results go to $OUT (the device tool's
# folder) or build-gpu/results. Exits 2 with the reason where there is no GPU or no .carry.
#   device run: bash scripts/gpu_bench.sh        (carry: [".carry"])
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${FULGUR_PYTHON:-$(command -v python3 || true)}"
if [ -z "$python" ] || ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "scripts/gpu_bench.sh: no CUDA device here (torch.cuda.is_available() is false for ${python:-no python3});" \
       "run it on a machine with an NVIDIA GPU and a CUDA build of torch (FULGUR_PYTHON names the Python)." >&2
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
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  date -u
} | tee "$out/machine.txt"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFULGUR_PYTHON="$python" \
      -DCMAKE_PREFIX_PATH="$carry" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target fulgur_gpu_tests bench_matrix \
      >"$out/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$out/build.log" | head -60; exit 1; }
status=0
echo "== CUDA tests"
"$build/tests/fulgur_gpu_tests" 2>&1 | tee "$out/cuda_tests.txt" | tail -15 || status=1
echo "== policy matrix, CUDA single device"
"$build/bench/bench_matrix" --benchmark_filter='/cuda/single_device/' --benchmark_counters_tabular=true \
  --benchmark_out="$out/matrix_cuda.json" --benchmark_out_format=json 2>&1 | tee "$out/matrix_cuda.txt" || status=1
exit $status
