#!/usr/bin/env bash
# SyncBatchNorm on N Gloo ranks: PyTorch's reference (sync_batchnorm_reference.py under torchrun on N
# ranks, made now from the venv) then fulgur's worker comparing with it on the same N ranks.
# usage: sync_batchnorm.sh TORCHRUN WORKER RANKS PORT OUT_DIR
set -euo pipefail
torchrun=$1 worker=$2 ranks=$3 port=$4 out=$5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out" && mkdir -p "$out"
export OMP_NUM_THREADS=1
if ! "$torchrun" --nproc-per-node="$ranks" --master-port="$port" "$here/sync_batchnorm_reference.py" "$out"; then
  echo "FAILED: the Python reference did not run"
  exit 1
fi
exec "$torchrun" --nproc-per-node="$ranks" --master-port=$((port + 1)) --no-python "$worker" parity "$out"
