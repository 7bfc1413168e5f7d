#!/usr/bin/env bash
# The demo: set up if needed, build, train the digits classifier end to end, print its accuracy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${FULGUR_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target digits_classifier
"$root/.venv/bin/python" "$root/scripts/export_digits.py" "$build/data/digits.csv"
cd "$build"  # the run's logs go to $build/logs/lightning_logs/version_N
"$build/examples/digits_classifier" "$build/data/digits.csv" "$@"
