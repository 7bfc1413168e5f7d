#!/usr/bin/env bash
# ctest's check of the GPT example: it learns (the validation loss falls below --goal), it resumes
# exactly (a run stopped at step 40 and continued with --resume ends on the validation loss of the
# straight run, to the last printed digit), and it writes its checkpoints and TensorBoard logs.
#   check_resume.sh GPT_BINARY DATA_DIR RUNS_DIR
set -euo pipefail
gpt="$1" data="$2" runs="$3"
rm -rf "$runs" && mkdir -p "$runs"
common=(--data "$data" --max-steps 60 --val-every 20 --workers 2 --goal 3.0)
loss() { grep -o 'validation loss [0-9.]*' "$1" | tail -1; }

"$gpt" train "${common[@]}" --out "$runs/straight" > "$runs/straight.log" 2>&1 || { cat "$runs/straight.log"; exit 1; }
"$gpt" train "${common[@]}" --out "$runs/parts" --stop-at-step 40 > "$runs/first.log" 2>&1 || { cat "$runs/first.log"; exit 1; }
test -f "$runs/parts/checkpoints/last.ckpt" || { echo "no last.ckpt after the first part"; exit 1; }
"$gpt" train "${common[@]}" --out "$runs/parts" --resume > "$runs/resumed.log" 2>&1 || { cat "$runs/resumed.log"; exit 1; }
cat "$runs/resumed.log"
grep -q "restoring states from the checkpoint path at .*/parts/checkpoints/last.ckpt" "$runs/resumed.log" ||
  { echo "the resumed run did not load last.ckpt"; exit 1; }
grep -q "max_steps=60 reached" "$runs/resumed.log" || { echo "the resumed run did not reach step 60"; exit 1; }
ls "$runs"/straight/lightning_logs/version_0/events.out.tfevents.* > /dev/null
straight="$(loss "$runs/straight.log")" resumed="$(loss "$runs/resumed.log")"
echo "straight: $straight; stopped at 40 and resumed: $resumed"
[[ -n "$straight" && "$straight" == "$resumed" ]] || { echo "the resumed run differs from the straight one"; exit 1; }
echo "gpt example: learns, resumes exactly"
