#!/usr/bin/env bash
# Builds and runs a benchmark: by default the step-time one (fit against the hand-written loop, per
# CPU precision); `--target bench_matrix` (scripts/bench_matrix.sh) the policy matrix. The other
# arguments go to the benchmark (Google Benchmark's flags, e.g. --benchmark_filter=...).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
me="${FULGUR_SCRIPT_NAME:-scripts/bench.sh}"
usage() {
  if [ "$me" = scripts/bench_matrix.sh ]; then
    echo "usage: bash $me [BENCHMARK FLAGS...]   (builds and runs bench_matrix)"
  else
    echo "usage: bash $me [--target TARGET] [BENCHMARK FLAGS...]"
    echo "  --target TARGET   the benchmark program to build and run: bench_step (default), bench_matrix or bench_cli_step"
  fi
  cat <<USAGE
  -h, --help        this text (nothing is built)
Other arguments go to the program, e.g. --benchmark_filter=mlp/cpu --benchmark_min_time=0.5;
bench_matrix also takes --threads=N (LibTorch intra-op threads; default 1, or FULGUR_BENCH_THREADS).
Environment: FULGUR_BUILD_DIR (default: build/).
USAGE
}
target=bench_step
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --target)
    if [ $# -lt 2 ] || [ -z "$2" ] || [ "${2#-}" != "$2" ]; then
      echo "$me: --target needs a value (bench_step, bench_matrix or bench_cli_step)" >&2
      usage >&2
      exit 2
    fi
    target=$2
    shift 2 ;;
  --target=*) target=${1#--target=}; shift ;;
esac
case "$target" in
  bench_step|bench_matrix|bench_cli_step) ;;
  *) echo "$me: unknown target '$target' (bench_step, bench_matrix or bench_cli_step)" >&2; exit 2 ;;
esac
for arg in "$@"; do
  case "$arg" in -h|--help) usage; exit 0 ;; esac
done
bash "$root/scripts/setup.sh"
build="${FULGUR_BUILD_DIR:-$root/build}"
# Figures come from -O3: a build the test suite made (-DFULGUR_BENCH_OPTIMIZED=OFF) is turned back.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFULGUR_BENCH_OPTIMIZED=ON >/dev/null
cmake --build "$build" --target "$target"
"$build/bench/$target" --benchmark_counters_tabular=true "$@"
