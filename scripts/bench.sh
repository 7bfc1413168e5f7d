#!/usr/bin/env bash
# Builds and runs the step-time benchmark (fit against the hand-written loop, per CPU precision).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${FULGUR_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target bench_step
"$build/bench/bench_step" --benchmark_counters_tabular=true "$@"
