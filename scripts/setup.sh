#!/usr/bin/env bash
# Idempotent set-up: Debian packages + a project-local venv with LibTorch from PyPI.
# Re-running when everything is present takes seconds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FULGUR_VENV:-$root/.venv}"

TORCH_VERSION=2.11.0
LIGHTNING_VERSION=2.6.6
SKLEARN_VERSION=1.7.2
NUMPY_VERSION=2.3.5
TENSORBOARD_VERSION=2.21.0  # the logger tests read fulgur's event files with its reader
MATPLOTLIB_VERSION=3.11.2   # bench/compare/compare.py's plots
JSONARGPARSE_VERSION=4.53.0  # LightningCLI's parser: the fulgur::cli parity test reads configs with it
MLFLOW_VERSION=3.17.2       # the MLFlowLogger tests run `mlflow server` and read runs back with MlflowClient

debs=(libboost-dev libyaml-cpp-dev libcurl4-openssl-dev catch2 libbenchmark-dev ccache python3-venv ninja-build iproute2 procps clang-16)
# scripts/check.sh adds what its gates need beyond the test suite (clang-tidy-16).
read -r -a extra_debs <<< "${FULGUR_EXTRA_DEBS:-}"
debs+=(${extra_debs[@]+"${extra_debs[@]}"})
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

stamp="$venv/.fulgur-setup-$TORCH_VERSION-$LIGHTNING_VERSION-$SKLEARN_VERSION-$TENSORBOARD_VERSION-$MATPLOTLIB_VERSION-$JSONARGPARSE_VERSION-$MLFLOW_VERSION"
if [ ! -f "$stamp" ]; then
  py="${FULGUR_PYTHON:-python3}"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  # torch with its CUDA libraries takes about 5.1 GiB installed: say so up front rather than fail
  # half-way with pip's "No space left on device" (seen once on a CI machine with little disk).
  need_kib=$((6 * 1024 * 1024))
  free_kib=$(df -Pk "$venv" | awk 'NR == 2 { print $4 }')
  if [ -n "$free_kib" ] && [ "$free_kib" -lt "$need_kib" ]; then
    echo "[setup] not enough disk for LibTorch: $((free_kib / 1024)) MiB free at $venv, about 6144 MiB needed" \
         "(torch $TORCH_VERSION with its CUDA libraries); free some space or set FULGUR_VENV to a larger disk" >&2
    exit 1
  fi
  "$venv/bin/python" -m pip install -q --no-cache-dir --upgrade pip
  echo "[setup] installing torch==$TORCH_VERSION (LibTorch) into $venv"
  # No pip cache: a second copy of the wheels (gigabytes) is what fills a small disk.
  "$venv/bin/python" -m pip install -q --no-cache-dir "torch==$TORCH_VERSION" "numpy==$NUMPY_VERSION" \
      "scikit-learn==$SKLEARN_VERSION" "lightning==$LIGHTNING_VERSION" \
      "tensorboard==$TENSORBOARD_VERSION" "matplotlib==$MATPLOTLIB_VERSION" \
      "jsonargparse[signatures]==$JSONARGPARSE_VERSION" "mlflow==$MLFLOW_VERSION"
  touch "$stamp"
fi
echo "[setup] ok: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
