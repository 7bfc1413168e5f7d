#!/usr/bin/env bash
# Starts 2 ranks of `<worker> <scenario>` (default: ddp_worker fault) by hand (the torchrun
# variables, no agent). Mode sigkill: SIGKILLs rank 1 once it trains; mode exception: rank 1's
# training_step raises; mode self: rank 1 kills itself where the scenario says (sharded_worker
# fault@3: inside a stage-3 forward, between two gathers). Either way rank 0 must exit non-zero
# within 60 s with a DistributedError naming the operation, its rank and the lost rank.
set -u
worker=$1
port=$2
mode=${3:-sigkill}
scenario=${4:-fault}
log=$(mktemp -d)
common=(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 OMP_NUM_THREADS=1
        FULGUR_TEST_TIMEOUT_MS=20000 FULGUR_FAULT=$mode)
env "${common[@]}" RANK=0 LOCAL_RANK=0 "$worker" "$scenario" >"$log/r0" 2>&1 &
r0=$!
env "${common[@]}" RANK=1 LOCAL_RANK=1 "$worker" "$scenario" >"$log/r1" 2>&1 &
r1=$!
if [ "$mode" = sigkill ]; then
  for _ in $(seq 1 300); do grep -q "training" "$log/r1" 2>/dev/null && break; sleep 0.1; done
  sleep 1
  kill -9 $r1 || { echo "FAIL: rank 1 was gone before the SIGKILL"; exit 1; }
else
  wait $r1
  echo "--- rank 1 (exit $?):"; cat "$log/r1"
fi
start=$SECONDS
wait $r0
status=$?
elapsed=$((SECONDS - start))
echo "--- rank 0 (exit $status after ${elapsed}s):"; cat "$log/r0"
named=$(grep -c "#[0-9]* on rank 0 of 2 failed: rank 1 stopped responding" "$log/r0")
rm -rf "$log"
if [ "$named" -eq 0 ]; then echo "FAIL: rank 0's error does not name the operation, its rank and the lost rank"; exit 1; fi
if [ $status -eq 0 ]; then echo "FAIL: rank 0 exited 0 after its peer was killed"; exit 1; fi
if [ $elapsed -gt 60 ]; then echo "FAIL: rank 0 took ${elapsed}s to notice"; exit 1; fi
echo "rank 0 stopped with status $status"
exit 0
