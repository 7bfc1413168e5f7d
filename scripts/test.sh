#!/usr/bin/env bash
# The test suite: set up if needed, build everything, run ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Where the time went, said at the end however it ends (CI's 40-minute budget is watched from its log).
phases=()
phase() { phases+=("$1 $((SECONDS - phase_began)) s"); phase_began=$SECONDS; }
said() { local joined; printf -v joined '%s, ' "${phases[@]}"; echo "fulgur: scripts/test.sh took ${SECONDS} s (${joined%, })"; }
trap 'phase "${current:-?}"; said' EXIT
phase_began=$SECONDS
current=set-up
bash "$root/scripts/setup.sh"
phase set-up; current=build
build="${FULGUR_BUILD_DIR:-$root/build}"
jobs="${FULGUR_JOBS:-$(nproc)}"
# What keeps a fresh run on 2 cores short: the benchmarks and examples built for their tests, not their
# speed (bench/CMakeLists.txt, examples/CMakeLists.txt); the add_subdirectory consumer configured, its
# second libfulgur built by `scripts/check.sh clang` (tests/package/CMakeLists.txt).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFULGUR_BENCH_OPTIMIZED=OFF \
      -DFULGUR_EXAMPLES_OPTIMIZED=OFF -DFULGUR_PACKAGE_BUILD_TESTS=OFF
cmake --build "$build" -j "$jobs"
phase build; current=tests
# One LibTorch (OpenMP) thread per test process: ctest runs $jobs tests at once, and OpenMP threads that spin
# while another test holds the core cost 20x the CPU (the digits example: 35 s instead of 1.8 s).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
