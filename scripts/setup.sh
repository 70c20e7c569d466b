#!/usr/bin/env bash
# Sets up a fresh machine for ringflow, unattended and idempotent: Debian's OpenMPI, a virtual
# environment in .venv, torch (CPU build), Horovod built from source with the C++17 fix
# (docker/build-horovod.sh says why), and ringflow itself with Airflow and the test tools.
# A second run reuses the venv and the cached Horovod wheel and finishes in seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck disable=SC1091
source versions.env
venv=${RINGFLOW_VENV:-$root/.venv}
cache=${RINGFLOW_CACHE:-$HOME/.cache/ringflow}
stamp="$venv/.ringflow-setup-$(cat pyproject.toml versions.env | sha256sum | cut -c1-16)"

if [ -f "$stamp" ]; then
  exit 0
fi

# mpicxx (libopenmpi-dev) is what Horovod's MPI controller compiles against; mpirun runs the jobs.
if ! command -v mpirun >/dev/null || ! command -v mpicxx >/dev/null || ! command -v cmake >/dev/null; then
  echo "[setup] installing OpenMPI, cmake and g++ from Debian"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openmpi-bin libopenmpi-dev cmake g++ >/dev/null
fi
# chromium: tests/ui drive the Airflow UI with Playwright through Debian's browser (no download possible).
if ! command -v chromium >/dev/null; then
  echo "[setup] installing chromium from Debian"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
# buildah, debootstrap, iproute2: tests/multihost builds the training image and runs an MPIJob across
# network-namespace hosts made of it.
"$root"/scripts/setup-multihost.sh

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip wheel setuptools
"$py" -m pip install --quiet "torch==$TORCH_VERSION"

if ! "$py" -c "import horovod.torch" 2>/dev/null; then
  echo "[setup] building Horovod $HOROVOD_VERSION (about 3 minutes the first time)"
  "$py" -m pip install --quiet cmake packaging psutil pyyaml cloudpickle
  PYTHON="$py" docker/build-horovod.sh "$cache/wheels"
  "$py" -m pip install --quiet "$cache"/wheels/horovod-"$HOROVOD_VERSION"-*.whl
fi

echo "[setup] installing ringflow and its dependencies"
"$py" -m pip install --quiet -e ".[airflow,mlflow,test]"
# The MLflow tracking server the tests start (tests/training/core/tracking): the full mlflow (server, UI, SQL store)
# in a venv of its own inside $venv, so its pins never move the Airflow venv's (the client there is
# mlflow-skinny, same version); boto3 for s3:// artifact stores (MinIO). Versions come from pyproject.toml.
mlflow_version=$(sed -n 's/^ *"mlflow-skinny==\([^"]*\)".*/\1/p' pyproject.toml)
boto3_version=$(sed -n 's/^ *"boto3==\([^"]*\)".*/\1/p' pyproject.toml)
mlflow_venv=${RINGFLOW_MLFLOW_VENV:-$venv/mlflow-server}
if ! "$mlflow_venv/bin/mlflow" --version 2>/dev/null | grep -qF "$mlflow_version"; then
  echo "[setup] installing the MLflow $mlflow_version server in $mlflow_venv"
  python3 -m venv "$mlflow_venv"
  "$mlflow_venv/bin/python" -m pip install --quiet "mlflow==$mlflow_version" "boto3==$boto3_version" \
    "botocore==$boto3_version"
fi
# The TensorFlow engine's ranks (training/rank/engines/tensorflow.py) run from a venv of their own inside $venv:
# tensorflow-cpu and what ringflow's torch-free modules need (numpy, pyarrow, pandas, boto3 for s3:// stores), with
# ringflow installed --no-deps, so neither venv's pins move the other's and the Airflow/torch venv never
# imports TensorFlow. The launcher starts the ranks with this venv's interpreter ($RINGFLOW_TF_PYTHON overrides).
# numpy, pyarrow, pandas: the ranges pyproject.toml gives; boto3: its pin.
tf_venv=${RINGFLOW_TF_VENV:-$venv/tensorflow}
if ! "$tf_venv/bin/python" -c "import tensorflow as tf, sys; sys.exit(tf.__version__ != '$TENSORFLOW_VERSION')" \
    2>/dev/null; then
  echo "[setup] installing tensorflow-cpu $TENSORFLOW_VERSION in $tf_venv"
  python3 -m venv "$tf_venv"
  "$tf_venv/bin/python" -m pip install --quiet --upgrade pip
  "$tf_venv/bin/python" -m pip install --quiet "tensorflow-cpu==$TENSORFLOW_VERSION" \
    "$(sed -n 's/^ *"\(numpy[^"]*\)".*/\1/p' pyproject.toml)" "$(sed -n 's/^ *"\(pyarrow[^"]*\)".*/\1/p' pyproject.toml)" \
    "$(sed -n 's/^ *"\(pandas[^"]*\)".*/\1/p' pyproject.toml)" \
    "boto3==$boto3_version" "botocore==$boto3_version"
fi
# Editable, as in $venv: the ranks run this checkout's code.
"$tf_venv/bin/python" -m pip install --quiet --no-deps -e .
"$venv/bin/horovodrun" --check-build
rm -f "$venv"/.ringflow-setup-*
touch "$stamp"
