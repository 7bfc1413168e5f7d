#!/usr/bin/env bash
# A CLI program run under DDP with 2 CPU ranks, started by fulgur's launcher (which runs the program
# again for each worker): every rank trains the config the user gave, even one read from a pipe that
# the workers could not read again (the probe found them training the defaults), with the same drawn seed.
#   check_ddp.sh TINY_PROGRAM SCRATCH_DIR
set -uo pipefail
program="$1" scratch="$2"
rm -rf "$scratch" && mkdir -p "$scratch"
"$program" fit --trainer.strategy=ddp --trainer.devices=2 --trainer.accelerator=cpu --trainer.max_epochs=2 \
  --trainer.enable_progress_bar=false --trainer.default_root_dir="$scratch" --trainer.logger=CSVLogger \
  --config <(printf 'model:\n  hidden: 5\n') > "$scratch/out.log" 2>&1
code=$?
cat "$scratch/out.log"
[[ $code == 0 ]] || { echo "FAIL: exit code $code"; exit 1; }
config="$scratch/lightning_logs/version_0/config.yaml"
grep -q "^  hidden: 5$" "$config" || { echo "FAIL: $config does not have the piped hidden: 5"; exit 1; }
grep -Eq "^seed_everything: [0-9]+$" "$config" || { echo "FAIL: no drawn seed in $config"; exit 1; }
grep -q "fit: max_epochs=2 reached" "$scratch/out.log" || { echo "FAIL: fit did not finish"; exit 1; }
echo "cli ddp: the workers ran the launching process's config"
