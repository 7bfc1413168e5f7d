#!/usr/bin/env bash
# Builds and runs a benchmark: by default the step-time one (fit against the hand-written loop, per
# CPU precision); `--target bench_matrix` (scripts/bench_matrix.sh) the policy matrix. The other
# arguments go to Google Benchmark (e.g. --benchmark_filter=...).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target=bench_step
if [ "${1:-}" = "--target" ]; then
  target=$2
  shift 2
fi
bash "$root/scripts/setup.sh"
build="${FULGUR_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target "$target"
"$build/bench/$target" --benchmark_counters_tabular=true "$@"
