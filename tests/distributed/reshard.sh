#!/usr/bin/env bash
# Sharded optimizer states on another world size: each phase of `sharded_worker` writes on 2 and on
# 3 ranks (DDP, stages 1, 2 and 3 — stage 3 with its weights sharded too), then reads them on 3 and 2 ranks (resharded) and on one process
# (consolidated). Prints "RESHARD OK" when every phase passed.
set -u
torchrun=$1
worker=$2
port=$3
dir=$4
rm -rf "$dir" && mkdir -p "$dir"
export OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=60000
run() {  # ranks, then the worker's arguments
  local ranks=$1
  shift
  echo "=== $ranks rank(s): $*"
  if [ "$ranks" = 1 ]; then
    "$worker" "$@" || { echo "FAILED: $*"; exit 1; }
  else
    port=$((port + 1))
    "$torchrun" --nproc-per-node="$ranks" --master-port="$port" --no-python "$worker" "$@" || { echo "FAILED: $*"; exit 1; }
  fi
}
run 2 reshard_save "$dir"
run 3 reshard_save "$dir"
run 3 reshard_load "$dir" 2   # 2 -> 3
run 2 reshard_load "$dir" 3   # 3 -> 2
run 1 reshard_load "$dir" 3   # 3 -> 1: consolidated
run 1 reshard_load "$dir" 2   # 2 -> 1
echo "RESHARD OK"
