#!/usr/bin/env bash
# SIGTERM to fulgur's launcher reaches its workers: all of them end, and the launcher exits 128+15.
set -u
worker=$1
log=$(mktemp)
OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=20000 "$worker" fault >"$log" 2>&1 &
supervisor=$!
for _ in $(seq 1 300); do [ "$(grep -c training "$log")" -ge 2 ] && break; sleep 0.1; done
children=$(pgrep -P $supervisor | tr '\n' ' ')
kill -TERM $supervisor
wait $supervisor
status=$?
sleep 0.5
alive=0
for pid in $children; do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done
cat "$log"; rm -f "$log"
echo "launcher exit $status; workers were: $children; still alive: $alive"
[ $status -eq 143 ] && [ -n "$children" ] && [ $alive -eq 0 ] && echo "signal forwarded"
