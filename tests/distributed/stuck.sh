#!/usr/bin/env bash
# A stuck rank is named, not only a dead one: `<ddp_worker> stuck <mode>` starts 3 ranks under the
# built-in launcher with a 10 s collective timeout. sleep: rank 1 sleeps in training_step (alive);
# skip: rank 1 skips a barrier. Ranks 0 and 2 must stop with rank 1 named and where it is, the run
# must end non-zero within the timeout and a few seconds, and the launcher must name rank 1 as the
# cause (not the rank that reported it).
#   stuck.sh WORKER MODE                   under fulgur's launcher
#   stuck.sh WORKER MODE TORCHRUN PORT     under torchrun: its summary's root cause must name rank 1
set -u
worker=$1
mode=$2
torchrun=${3:-}
log=$(mktemp)
start=$SECONDS
if [ -n "$torchrun" ]; then
  env OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=10000 "$torchrun" --nproc-per-node=3 --master-port="$4" --no-python \
    "$worker" stuck "$mode" >"$log" 2>&1
else
  env OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=10000 "$worker" stuck "$mode" >"$log" 2>&1
fi
status=$?
elapsed=$((SECONDS - start))
cat "$log"
fail() { echo "FAILED: $*"; rm -f "$log"; exit 1; }
[ $status -ne 0 ] || fail "the run ended with status 0"
[ $elapsed -le 45 ] || fail "the run took ${elapsed}s to end (collective timeout 10 s)"
case $mode in
  sleep) pattern="rank 1 is alive but has not reached it: .*its last position training_step, epoch 1, batch 3" ;;
  skip) pattern="rank 1 is in .*, not barrier #[0-9]*: the ranks called different collectives" ;;
  *) fail "unknown mode $mode" ;;
esac
for r in 0 2; do
  grep -q "rank $r stopped: .* on rank $r of 3 .*$pattern" "$log" || fail "rank $r's error does not name rank 1 and where it is"
done
if [ -n "$torchrun" ]; then
  # torchrun's summary: the first failure's error file (TORCHELASTIC_ERROR_FILE), not "Signal 6".
  sed -n '/Root Cause (first observed failure)/,$p' "$log" | grep -q "traceback *: fulgur: .*$pattern" ||
    fail "torchrun's root cause does not name rank 1 and where it is"
else
  grep -q "fulgur launcher: the run failed: rank 1 stuck" "$log" || fail "the launcher does not name rank 1 as the cause"
fi
rm -f "$log"
echo "stuck rank named after ${elapsed}s"
