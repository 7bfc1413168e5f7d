#!/usr/bin/env bash
# ctest's check of the GPT example: it learns (the validation loss falls below --goal), it resumes
# exactly (a run stopped at step 40 by trainer.max_steps — the schedule still 60 steps long — and continued
# with --ckpt_path=last ends on the validation loss of the straight run, to the last printed digit), and
# it writes its checkpoints, TensorBoard logs and resolved config.
#   check_resume.sh GPT_BINARY DATA_DIR RUNS_DIR
set -euo pipefail
gpt="$1" data="$2" runs="$3"
rm -rf "$runs" && mkdir -p "$runs"
common=(--data.dir="$data" --model.max_steps=60 --model.warmup_steps=7 --trainer.max_steps=60 --trainer.val_check_interval=20
        --trainer.enable_progress_bar=false --model.sample_bytes=0 --goal 3.0)
folders() { echo --trainer.default_root_dir="$runs/$1" --trainer.callbacks.dirpath="$runs/$1/checkpoints"; }
loss() { grep -o 'val_loss=[0-9.]*' "$1" | tail -1; }

"$gpt" fit "${common[@]}" $(folders straight) > "$runs/straight.log" 2>&1 || { cat "$runs/straight.log"; exit 1; }
"$gpt" fit "${common[@]}" $(folders parts) --trainer.max_steps=40 > "$runs/first.log" 2>&1 || { cat "$runs/first.log"; exit 1; }
test -f "$runs/parts/checkpoints/last.ckpt" || { echo "no last.ckpt after the first part"; exit 1; }
"$gpt" fit "${common[@]}" $(folders parts) --ckpt_path=last > "$runs/resumed.log" 2>&1 || { cat "$runs/resumed.log"; exit 1; }
cat "$runs/resumed.log"
grep -q "restoring states from the checkpoint path at .*/parts/checkpoints/last.ckpt" "$runs/resumed.log" ||
  { echo "the resumed run did not load last.ckpt"; exit 1; }
grep -q "max_steps=60 reached" "$runs/resumed.log" || { echo "the resumed run did not reach step 60"; exit 1; }
ls "$runs"/straight/lightning_logs/version_0/events.out.tfevents.* > /dev/null
grep -q "^  max_steps: 60$" "$runs/straight/lightning_logs/version_0/config.yaml" || { echo "no resolved config.yaml"; exit 1; }
straight="$(loss "$runs/straight.log")" resumed="$(loss "$runs/resumed.log")"
echo "straight: $straight; stopped at 40 and resumed: $resumed"
[[ -n "$straight" && "$straight" == "$resumed" ]] || { echo "the resumed run differs from the straight one"; exit 1; }
# The loss of the checkpoint's weights, read back by validate, is the one fit reported at its last validation.
"$gpt" validate --data.dir="$data" $(folders parts) --ckpt_path=last > "$runs/validate.log" 2>&1 || { cat "$runs/validate.log"; exit 1; }
validated="$(loss "$runs/validate.log")"
echo "validate --ckpt_path=last: $validated"
[[ "$validated" == "$resumed" ]] || { echo "validate of last.ckpt differs from fit's last validation"; exit 1; }
echo "gpt example: learns, resumes exactly"
