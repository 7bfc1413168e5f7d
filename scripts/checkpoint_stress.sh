#!/usr/bin/env bash
# Checkpoint I/O under stress, longer than ctest runs it: the mutation fuzzer for <seconds> (seed
# from the clock unless FULGUR_FUZZ_SEED is set; with a Python torch.save file as an extra seed when
# the venv has torch), then the SIGKILL-mid-save trials FULGUR_CHECKPOINT_KILL_TRIALS times (500).
#   scripts/checkpoint_stress.sh [seconds=300]
# Builds the two targets in $FULGUR_BUILD_DIR (default: build). Crashing inputs are written to
# $FULGUR_FUZZ_ARTIFACTS (default: <build>/checkpoint-fuzz-artifacts); replay one with
#   <build>/tests/checkpoint/fulgur_checkpoint_fuzz --replay <file>
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-300}"
build="${FULGUR_BUILD_DIR:-$root/build}"
seed="${FULGUR_FUZZ_SEED:-$(date +%s)}"
trials="${FULGUR_CHECKPOINT_KILL_TRIALS:-500}"
export FULGUR_FUZZ_ARTIFACTS="${FULGUR_FUZZ_ARTIFACTS:-$build/checkpoint-fuzz-artifacts}"
mkdir -p "$FULGUR_FUZZ_ARTIFACTS"

[[ -f "$build/build.ninja" || -f "$build/Makefile" ]] || cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "${FULGUR_JOBS:-$(nproc)}" --target fulgur_checkpoint_fuzz fulgur_checkpoint_io_tests

extra=()
python="$root/.venv/bin/python"
if [[ -x "$python" ]]; then
  seed_file="$FULGUR_FUZZ_ARTIFACTS/python-seed.pt"
  "$python" - "$seed_file" <<'PY' && extra+=("$seed_file")
import sys, torch
t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
torch.save({"weight": t, "column": t[:, 1], "again": t, "half": torch.ones(3, dtype=torch.float16),
            "steps": torch.arange(4), "one": [1], "list": [1, 2.5, "x", None, True], "tuple": (1, "a"),
            "nested": {"a": {"b": [torch.zeros(2, dtype=torch.int8)]}}}, sys.argv[1])
PY
fi

echo "== fuzzing from_bytes for ${seconds} s (seed ${seed})"
"$build/tests/checkpoint/fulgur_checkpoint_fuzz" "$seconds" "$seed" "${extra[@]}"

echo "== SIGKILL mid-save: ${trials} trials"
FULGUR_CHECKPOINT_KILL_TRIALS="$trials" FULGUR_CHECKPOINT_KILL_SEED="$seed" \
  "$build/tests/checkpoint/fulgur_checkpoint_io_tests" "[kill]"
