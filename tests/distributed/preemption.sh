#!/usr/bin/env bash
# Preemption of a 2-rank run under fulgur's launcher (ddp_worker preempt):
#   1. a straight run to max_steps;
#   2. the same run, slowed down, gets SIGTERM (or SIGUSR1) at the launcher while it trains, in a
#      fake SLURM batch job: every rank must stop after a batch, rank 0 write hpc_ckpt_1.ckpt and
#      call `scontrol requeue <job>` (a stand-in on PATH), the launcher exit 75;
#   3. the requeued job runs the program again without a checkpoint path: it finds
#      hpc_ckpt_1.ckpt by itself and must end with the straight run's weights, bit for bit.
set -u
worker=$1
signal=${2:-TERM}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/straight" "$root/preempted"
cat >"$root/bin/scontrol" <<STUB
#!/bin/sh
echo "\$@" >"$root/scontrol.args"
STUB
chmod +x "$root/bin/scontrol"
export OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=60000

"$worker" preempt straight "$root/straight" >"$root/straight.log" 2>&1 || { cat "$root/straight.log"; echo "straight run failed"; exit 1; }

PATH="$root/bin:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NAME=train "$worker" preempt run "$root/preempted" >"$root/run.log" 2>&1 &
supervisor=$!
for _ in $(seq 1 300); do [ "$(grep -c training "$root/run.log")" -ge 2 ] && break; sleep 0.1; done
sleep 0.7
kill -"$signal" $supervisor
wait $supervisor
status=$?
cat "$root/run.log"
echo "launcher exit $status"
[ $status -eq 75 ] || { echo "expected exit code 75 after the preemption"; exit 1; }
[ -f "$root/preempted/hpc_ckpt_1.ckpt" ] || { echo "no hpc_ckpt_1.ckpt"; ls -la "$root/preempted"; exit 1; }
[ "$(cat "$root/scontrol.args" 2>/dev/null)" = "requeue 4242" ] || { echo "scontrol requeue 4242 was not called"; exit 1; }
grep -q "preempted by SIG$signal" "$root/run.log" || { echo "no preemption message"; exit 1; }

PATH="$root/bin:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NAME=train "$worker" preempt resume "$root/preempted" >"$root/resume.log" 2>&1
status=$?
cat "$root/resume.log"
[ $status -eq 0 ] || { echo "the resumed run failed"; exit 1; }
grep -q "resuming from the preemption checkpoint" "$root/resume.log" || { echo "did not resume by itself"; exit 1; }
cmp "$root/straight/straight.weights" "$root/preempted/resume.weights" && echo "preempted run resumed exactly"
