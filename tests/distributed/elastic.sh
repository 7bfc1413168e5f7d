#!/usr/bin/env bash
# Elastic restart (tests/distributed/elastic.hpp): a 2-rank run with a ModelCheckpoint every 5 steps
# has one rank SIGKILLed once at a random step; the launcher restarts both ranks (max_restarts = 1),
# which resume by themselves from the newest complete checkpoint; the final weights must equal an
# uninterrupted run's, bit for bit. Prints the restart-to-resume time (kill -> first resumed step).
#   elastic.sh <worker> launcher [incomplete]   fulgur's launcher (TrainerConfig::max_restarts = 1);
#       incomplete: the newest checkpoint loses its parts (sharded) before the kill: the ranks fall back
#   elastic.sh <worker> torchrun <torchrun> <port>
# FULGUR_TEST_KILL_STEP / FULGUR_TEST_KILL_RANK pin the kill (default: random step 6..38, random rank).
set -u
worker=$1
launcher=$2
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/straight" "$root/killed"
export OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=60000
fail() { echo "FAILED: $*"; exit 1; }

if [ "$launcher" = torchrun ]; then
  run() { local folder=$1; shift; env "$@" "$torchrun" --nproc-per-node=2 --max-restarts=1 --master-port="$port" \
            --no-python "$worker" elastic "$folder"; }
  torchrun=$3
  port=$4
else
  run() { local folder=$1; shift; env "$@" "$worker" elastic "$folder"; }
  incomplete=${3:-}
fi

if [ -n "${incomplete:-}" ]; then  # a checkpoint before the newest one to fall back to
  step=${FULGUR_TEST_KILL_STEP:-$((11 + RANDOM % 28))}
  export FULGUR_TEST_BREAK_NEWEST=1
else
  step=${FULGUR_TEST_KILL_STEP:-$((6 + RANDOM % 33))}
fi
rank=${FULGUR_TEST_KILL_RANK:-$((RANDOM % 2))}
echo "elastic ($launcher): rank $rank is SIGKILLed at global step $step"

run "$root/straight" >"$root/straight.log" 2>&1 || { cat "$root/straight.log"; fail "the uninterrupted run failed"; }
run "$root/killed" FULGUR_TEST_KILL_STEP="$step" FULGUR_TEST_KILL_RANK="$rank" >"$root/killed.log" 2>&1
status=$?
cat "$root/killed.log"
[ $status -eq 0 ] || fail "the restarted run ended with status $status"
[ -f "$root/killed/killed" ] || fail "no rank was killed (marker file missing)"
grep -q "fulgur: restart 1 ([a-z ]*): resuming from .*\.ckpt (global step [0-9]*)" "$root/killed.log" ||
  fail "the restarted ranks did not say which checkpoint they resume from"
resumed=$(grep -o "resuming from .*(global step [0-9]*)" "$root/killed.log" | head -1)
expected=$((step / 5 * 5))
if [ -n "${incomplete:-}" ]; then
  grep -q "passing over .*step=$expected\.ckpt (global step $expected): .*; falling back to the next checkpoint" \
    "$root/killed.log" || fail "the incomplete checkpoint of step $expected was not passed over, with the reason"
  expected=$((expected - 5))
fi
echo "$resumed" | grep -q "(global step $expected)" || fail "resumed as '$resumed', expected global step $expected"
if [ "$launcher" != torchrun ]; then
  grep -q "fulgur launcher: rank $rank ended with signal 9 (Killed). Restarting all 2 local ranks (restart 1 of 1)" \
    "$root/killed.log" || fail "the launcher did not say which rank failed and the restart"
fi
first=$(grep -o "first resumed step at [0-9]*" "$root/killed.log" | head -1 | grep -o "[0-9]*$")
[ -n "$first" ] || fail "no resumed step"
# A fresh start would end with the same weights too: the first step after the restart must be the checkpoint's.
grep -q "first resumed step at [0-9]* (global step $expected)" "$root/killed.log" ||
  fail "the restarted ranks did not train on from global step $expected"
killed_at=$(head -1 "$root/killed/killed")
echo "restart-to-resume time: $(( (first - killed_at) / 1000000 )) ms (kill at step $step -> first resumed step)"
cmp "$root/straight/weights" "$root/killed/weights" ||
  fail "the restarted run's weights differ from the uninterrupted run's"
echo "restarted run resumed exactly"
