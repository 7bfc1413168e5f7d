#!/usr/bin/env bash
# The digits example as a fulgur::cli program, from the outside: --help, --print_config round trips,
# and each kind of bad input exits 2 with a message naming what was wrong (docs/cli.md).
#   check_cli.sh DIGITS_CLASSIFIER CONFIG.yaml SCRATCH_DIR
set -uo pipefail
program="$1" config="$2" scratch="$3"
rm -rf "$scratch" && mkdir -p "$scratch"
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# expect_error "description" "expected text" args...: exit code 2 and the text on stderr.
expect_error() {
  local what="$1" text="$2"; shift 2
  local out code
  out="$("$program" "$@" 2>&1 >/dev/null)"; code=$?
  [[ $code == 2 ]] || fail "$what: exit code $code, expected 2 ($out)"
  [[ "$out" == *"$text"* ]] || fail "$what: '$text' not in: $out"
}

help="$("$program" fit --help)" || fail "fit --help failed"
for text in "--trainer.max_epochs  int | null (default: null)" "--model.lr  float (default: 0.002)" \
            "--data.batch_size  int (default: 64)" "EarlyStopping: stop when" "--seed_everything  bool | int"; do
  [[ "$help" == *"$text"* ]] || fail "fit --help lacks '$text'"
done

# print -> read -> print: the same text; overrides after --config win; a drawn seed is kept.
"$program" fit --config "$config" --model.lr=0.01 --trainer.precision=bf16-mixed --print_config > "$scratch/a.yaml" ||
  fail "print_config failed"
"$program" fit --config "$scratch/a.yaml" --print_config > "$scratch/b.yaml" || fail "print_config of the printed config failed"
cmp -s "$scratch/a.yaml" "$scratch/b.yaml" || fail "print -> read -> print changed the config: $(diff "$scratch/a.yaml" "$scratch/b.yaml")"
grep -q "^  lr: 0.01$" "$scratch/a.yaml" || fail "the override --model.lr=0.01 is not in the printed config"
grep -q "^  precision: bf16-mixed$" "$scratch/a.yaml" || fail "the override --trainer.precision is not in the printed config"
"$program" fit --print_config > "$scratch/seeded.yaml"
grep -Eq "^seed_everything: [0-9]+$" "$scratch/seeded.yaml" || fail "seed_everything: true did not print the seed drawn"

printf 'trainer:\n  max_epochs: 3\n  callbacks: [EarlyStopping\n' > "$scratch/broken.yaml"
printf 'trainer:\n  max_epoch: 3\n' > "$scratch/typo.yaml"
expect_error "unknown key" "unknown key 'trainer.max_epoch'; did you mean trainer.max_epochs?" fit --trainer.max_epoch=3
expect_error "unknown key in a file" "typo.yaml:2:3: unknown key 'trainer.max_epoch'; did you mean trainer.max_epochs?" \
  fit --config "$scratch/typo.yaml"
expect_error "wrong type" "--model.lr=fast: model.lr: expected float, got 'fast'" fit --model.lr=fast
expect_error "YAML syntax" "broken.yaml:4:1: YAML syntax error" fit --config "$scratch/broken.yaml"
expect_error "missing file" "cannot read the file (no such file)" fit --config "$scratch/none.yaml"
expect_error "strategy not compiled" "'ddp' is not a class this program compiled for it; it takes auto, single_device" \
  fit --trainer.strategy=ddp
expect_error "unknown precision" "--trainer.precision=fp8: trainer.precision: expected one of this program's '32-true'" \
  fit --trainer.precision=fp8
# --help shows the defaults the program and the files given set, not only the fields' own.
help_with_file="$("$program" fit --config "$config" --help)"
[[ "$help_with_file" == *"--trainer.max_epochs  int | null (default: 40)"* ]] ||
  fail "fit --config FILE --help does not show the file's max_epochs"
expect_error "unknown callback" "'EarlyStoping' is not a class this program compiled for it" fit --trainer.callbacks+=EarlyStoping
expect_error "unknown init_arg" "(EarlyStopping): unknown key 'patiense'; did you mean patience?" \
  fit --trainer.callbacks+=EarlyStopping --trainer.callbacks.patiense=3
expect_error "no subcommand" "is not a subcommand; the first argument is one of fit, validate, test, predict" \
  --trainer.max_epochs=3
expect_error "no arguments" "give a subcommand: fit, validate, test, predict"
expect_error "every problem at once" "2 problems" fit --model.lr=fast --data.batch_sise=3
expect_error "a config the Trainer refuses" "accumulate_grad_batches" fit --trainer.accumulate_grad_batches=0
# The environment is read only when asked.
unasked="$(FULGUR_TRAINER__MAX_EPOCHS=9 "$program" fit --print_config)"
grep -q "^  max_epochs: null$" <<<"$unasked" || fail "read the environment unasked"
asked="$(FULGUR_TRAINER__MAX_EPOCHS=9 "$program" fit --env_prefix FULGUR --print_config)"
grep -q "^  max_epochs: 9$" <<<"$asked" || fail "--env_prefix FULGUR did not read FULGUR_TRAINER__MAX_EPOCHS"

[[ $failed == 0 ]] && echo "digits cli: help, round trips and errors as documented"
exit $failed
