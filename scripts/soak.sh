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
# LibTorch's c10d Flight Recorder keeps a record of every process group (and a bounded ring of the last
# collectives) for the life of the process: ~1.4 KiB a DDP Trainer, which is LibTorch's, not a leak of
# fulgur's. Off here, so the fits measure fulgur (TORCH_FR_BUFFER_SIZE=2000 keeps it to see its cost).
export TORCH_FR_BUFFER_SIZE="${TORCH_FR_BUFFER_SIZE:-0}"
echo "soak: TORCH_FR_BUFFER_SIZE=$TORCH_FR_BUFFER_SIZE (LibTorch's flight recorder; see docs/soak.md)"
exec nice "$build/tests/soak/fulgur_soak" --steps 200000 --fits 1000 "$@"
