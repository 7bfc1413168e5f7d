#!/usr/bin/env bash
# Under fulgur's launcher (devices=2, no torchrun): SIGKILL one worker mid-epoch. The launcher must
# exit non-zero naming that rank and its signal, and the surviving worker must not be left running.
set -u
worker=$1
log=$(mktemp)
OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=20000 "$worker" fault >"$log" 2>&1 &
supervisor=$!
for _ in $(seq 1 300); do [ "$(grep -c training "$log")" -ge 2 ] && break; sleep 0.1; done
children=$(pgrep -P $supervisor | tr '\n' ' ')
victim=$(echo $children | awk '{print $2}')
sleep 0.5
kill -KILL "$victim"
start=$SECONDS
wait $supervisor
status=$?
elapsed=$((SECONDS - start))
sleep 0.5
alive=0
for pid in $children; do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done
cat "$log"; rm -f "$log"
echo "launcher exit $status after ${elapsed}s; still alive: $alive"
[ $status -ne 0 ] && [ $alive -eq 0 ] && [ $elapsed -le 60 ] && echo "lost worker reported"
