#!/usr/bin/env bash
# Starts 2 ranks of `<worker> <scenario>` (default: ddp_worker fault) by hand (the torchrun
# variables, no agent). Mode sigkill: SIGKILLs rank 1 once it trains; mode exception: rank 1's
# training_step raises; mode self: rank 1 kills itself where the scenario says (sharded_worker
# fault@3: inside a stage-3 forward, between two gathers); mode sigkill_store: SIGKILLs rank 0,
# which serves the rendezvous store, once it trains. Either way the surviving rank must exit non-zero
# within 60 s with a DistributedError naming the operation, its rank and the lost rank, and no
# rank's output may hold a C++ stack trace (c10's "Exception raised from ... frame #0: ...", which
# c10d's store client printed when the store's rank was gone): one clear cause per run.
set -u
worker=$1
port=$2
mode=${3:-sigkill}
scenario=${4:-fault}
victim=1
survivor=0
if [ "$mode" = sigkill_store ]; then victim=0; survivor=1; fi
log=$(mktemp -d)
common=(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 OMP_NUM_THREADS=1
        FULGUR_TEST_TIMEOUT_MS=20000 FULGUR_FAULT=$mode)
env "${common[@]}" RANK=0 LOCAL_RANK=0 "$worker" "$scenario" >"$log/r0" 2>&1 &
pid[0]=$!
env "${common[@]}" RANK=1 LOCAL_RANK=1 "$worker" "$scenario" >"$log/r1" 2>&1 &
pid[1]=$!
if [ "$mode" = sigkill ] || [ "$mode" = sigkill_store ]; then
  for _ in $(seq 1 300); do grep -q "training" "$log/r$victim" 2>/dev/null && break; sleep 0.1; done
  sleep 1
  kill -9 ${pid[$victim]} || { echo "FAIL: rank $victim was gone before the SIGKILL"; exit 1; }
  wait ${pid[$victim]} 2>/dev/null
else
  wait ${pid[$victim]}
  echo "--- rank $victim (exit $?):"; cat "$log/r$victim"
fi
start=$SECONDS
wait ${pid[$survivor]}
status=$?
elapsed=$((SECONDS - start))
echo "--- rank $survivor (exit $status after ${elapsed}s):"; cat "$log/r$survivor"
named=$(grep -cE "#[0-9]* on rank $survivor of 2 failed: rank $victim( stopped responding|, which serves the rendezvous store, is unreachable)" "$log/r$survivor")
traces=""
for rank in 0 1; do
  if grep -qE "frame #[0-9]+|Exception raised from " "$log/r$rank"; then
    traces="$traces $rank"
    echo "--- rank $rank's C++ stack trace:"; grep -m 5 -E "frame #[0-9]+|Exception raised from |\[c10d\]" "$log/r$rank"
  fi
done
rm -rf "$log"
if [ -n "$traces" ]; then echo "FAIL: a C++ stack trace in the output of rank(s)$traces"; exit 1; fi
if [ "$named" -eq 0 ]; then echo "FAIL: rank $survivor's error does not name the operation, its rank and the lost rank"; exit 1; fi
if [ $status -eq 0 ]; then echo "FAIL: rank $survivor exited 0 after its peer was lost"; exit 1; fi
if [ $elapsed -gt 60 ]; then echo "FAIL: rank $survivor took ${elapsed}s to notice"; exit 1; fi
echo "rank $survivor stopped with status $status"
exit 0
