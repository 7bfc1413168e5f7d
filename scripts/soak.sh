#!/usr/bin/env bash
# The long soak test (not in CI; ctest's soak.short is its short form): one fit of 200,000 steps with
# CSV + TensorBoard logging every step, a checkpoint every 1,000 steps and validation every epoch, then
# 1,000 fits in one process (single-device and DDP over a world of one, alternating). Prints a table of
# resident memory, open descriptors and threads; exits non-zero on a leak (tests/soak/soak.cpp says how
# each is judged).
#
#   scripts/soak.sh [BUILD_DIR] [--steps N] [--fits M]     (default: build/, 200,000 steps, 1,000 fits)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
if [[ $# -gt 0 && "$1" != --* ]]; then build="$1"; shift; fi
cmake --build "$build" --target fulgur_soak
exec nice "$build/tests/soak/fulgur_soak" --steps 200000 --fits 1000 "$@"
