#!/usr/bin/env bash
# A user's exception that leaves main uncaught under torchrun is written to the worker's error file
# (TORCHELASTIC_ERROR_FILE), so torchrun's failure summary shows it — type and message — as Python's
# @record does, instead of "Signal 6 (SIGABRT)" with no error file.
#   uncaught.sh WORKER TORCHRUN PORT
set -u
worker=$1
torchrun=$2
port=$3
log=$(mktemp)
env OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=20000 "$torchrun" --nproc-per-node=2 --master-port="$port" --no-python \
  "$worker" uncaught >"$log" 2>&1
status=$?
cat "$log"
fail() { echo "FAILED: $*"; rm -f "$log"; exit 1; }
[ $status -ne 0 ] || fail "the run ended with status 0"
summary=$(sed -n '/FAILED$/,$p' "$log")
echo "$summary" | grep -qE "traceback *: uncaught .*rank 1's training_step raised" ||
  fail "torchrun's summary does not show rank 1's uncaught exception"
rm -f "$log"
echo "uncaught exception reported to torchrun"
