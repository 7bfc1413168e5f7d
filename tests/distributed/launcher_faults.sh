#!/usr/bin/env bash
# fulgur's launcher (devices=2, no torchrun) running `ddp_worker fault`, hit while it trains:
#   sigterm: SIGTERM to the launcher reaches its workers; all end and the launcher exits 128+15.
#   sigkill: SIGKILL one worker; the launcher exits non-zero naming it within 60 s, no worker left.
# Either way no output holds a C++ stack trace (c10's "Exception raised from ... frame #0: ...").
set -u
worker=$1
mode=$2
log=$(mktemp)
OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=20000 "$worker" fault >"$log" 2>&1 &
supervisor=$!
for _ in $(seq 1 300); do [ "$(grep -c training "$log")" -ge 2 ] && break; sleep 0.1; done
children=$(pgrep -P $supervisor | tr '\n' ' ')
if [ "$mode" = sigterm ]; then
  kill -TERM $supervisor
else
  sleep 0.5
  kill -KILL "$(echo $children | awk '{print $2}')"
fi
start=$SECONDS
wait $supervisor
status=$?
elapsed=$((SECONDS - start))
sleep 0.5
alive=0
for pid in $children; do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done
cat "$log"
traces=$(grep -cE "frame #[0-9]+|Exception raised from " "$log")
rm -f "$log"
echo "launcher exit $status after ${elapsed}s; workers were: $children; still alive: $alive"
[ -n "$children" ] && [ $alive -eq 0 ] || exit 1
if [ "$traces" -ne 0 ]; then echo "FAIL: $traces line(s) of a C++ stack trace in the output"; exit 1; fi
if [ "$mode" = sigterm ]; then
  [ $status -eq 143 ] && echo "signal forwarded"
else
  [ $status -ne 0 ] && [ $elapsed -le 60 ] && echo "lost worker reported"
fi
