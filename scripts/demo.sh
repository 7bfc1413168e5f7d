#!/usr/bin/env bash
# The demo: set up if needed, build, train the digits classifier end to end, print its accuracy.
#   scripts/demo.sh [digits arguments]    the digits classifier (the default)
#   scripts/demo.sh gpt [train arguments] a byte-level GPT on Python's documentation text (docs/gpt-example.md)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${FULGUR_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
if [[ "${1:-}" == gpt ]]; then
  shift
  cmake --build "$build" --target gpt
  "$root/.venv/bin/python" "$root/scripts/gpt_corpus.py" "$build/data/gpt/corpus.txt"
  "$build/examples/gpt" prepare "$build/data/gpt/corpus.txt" --out "$build/data/gpt"
  cd "$build"  # checkpoints and logs go to $build/gpt_run
  # 1500 steps of 32 x 128 tokens; exits 1 above the stated validation loss (docs/gpt-example.md).
  "$build/examples/gpt" train --data data/gpt --out gpt_run --goal 1.60 "$@"
  exit
fi
cmake --build "$build" --target digits_classifier
"$root/.venv/bin/python" "$root/scripts/export_digits.py" "$build/data/digits.csv"
cd "$build"  # the run's logs go to $build/logs/lightning_logs/version_N
"$build/examples/digits_classifier" "$build/data/digits.csv" "$@"
