#!/usr/bin/env bash
# The test suite: set up if needed, build everything, run ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${FULGUR_BUILD_DIR:-$root/build}"
jobs="${FULGUR_JOBS:-$(nproc)}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"
# One LibTorch (OpenMP) thread per test process: ctest runs $jobs tests at once, and OpenMP threads that spin
# while another test holds the core cost 20x the CPU (the digits example: 35 s instead of 1.8 s).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
