#!/usr/bin/env bash
# Sets up a fresh machine for ringflow, unattended and idempotent: Debian's OpenMPI, a virtual
# environment in .venv, torch (CPU build), Horovod built from source with the C++17 fix
# (docker/build-horovod.sh says why), and ringflow itself with Airflow and the test tools.
# A second run reuses the venv and the cached Horovod wheel and finishes in seconds.
#
# What does not depend on each other runs side by side, because a fresh machine spends most of the setup
# waiting on the network: the Debian packages (one apt transaction), the MLflow server's and the TensorFlow
# engine's venvs and the main venv's downloads at once; only Horovod's build waits, for both the compilers (apt) and torch (pip).
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
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# side NAME COMMAND...: run COMMAND in the background, its output kept in a log shown only if it fails.
declare -A side_pids=()
side() {
  local name=$1; shift
  ( "$@" ) >"$logs/$name.log" 2>&1 &
  side_pids[$name]=$!
}
# wait_side NAME: wait for it; on failure print its log and stop the setup.
wait_side() {
  local name=$1
  if ! wait "${side_pids[$name]}"; then
    echo "[setup] $name failed:" >&2
    cat "$logs/$name.log" >&2
    exit 1
  fi
  cat "$logs/$name.log"
}

# Debian packages, in one transaction (each apt-get update costs a download of the indexes):
# mpicxx (libopenmpi-dev) is what Horovod's MPI controller compiles against, mpirun runs the jobs; chromium for
# tests/dags/ui (Playwright drives Debian's browser, no download possible); buildah, debootstrap, iproute2... for
# tests/multihost (scripts/setup-multihost.sh names them).
apt_need=()
command -v mpirun >/dev/null || apt_need+=(openmpi-bin)
command -v mpicxx >/dev/null || apt_need+=(libopenmpi-dev)
command -v cmake >/dev/null || apt_need+=(cmake)
command -v g++ >/dev/null || apt_need+=(g++)
command -v chromium >/dev/null || apt_need+=(chromium)
read -r -a multihost_need <<< "$("$root"/scripts/setup-multihost.sh --missing)"
apt_need+=("${multihost_need[@]}")
install_debian_packages() {
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "[setup] installing ${apt_need[*]} from Debian"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${apt_need[@]}" >/dev/null
}
if [ ${#apt_need[@]} -gt 0 ]; then
  side apt install_debian_packages
fi

# The MLflow tracking server the tests start (tests/training/core/tracking): the full mlflow (server, UI, SQL store)
# in a venv of its own inside $venv, so its pins never move the Airflow venv's (the client there is
# mlflow-skinny, same version); boto3 for s3:// artifact stores (MinIO). Versions come from pyproject.toml.
mlflow_version=$(sed -n 's/^ *"mlflow-skinny==\([^"]*\)".*/\1/p' pyproject.toml)
boto3_version=$(sed -n 's/^ *"boto3==\([^"]*\)".*/\1/p' pyproject.toml)
mlflow_venv=${RINGFLOW_MLFLOW_VENV:-$venv/mlflow-server}
make_mlflow_venv() {
  echo "[setup] installing the MLflow $mlflow_version server in $mlflow_venv"
  python3 -m venv "$mlflow_venv"
  "$mlflow_venv/bin/python" -m pip install --quiet "mlflow==$mlflow_version" "boto3==$boto3_version" \
    "botocore==$boto3_version"
}
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  python3 -m venv "$venv"
fi
if ! "$mlflow_venv/bin/mlflow" --version 2>/dev/null | grep -qF "$mlflow_version"; then
  side mlflow make_mlflow_venv
fi

# The TensorFlow engine's ranks (training/rank/tensorflow_worker.py) run from a venv of their own inside $venv:
# tensorflow-cpu and ringflow's requirements without torch (docker/requirements_without_torch.py --core, as the
# training image's /opt/tensorflow), with ringflow installed --no-deps (below), so neither venv's pins move
# the other's and the Airflow/torch venv never imports TensorFlow. The launcher starts the ranks with this
# venv's interpreter ($RINGFLOW_TF_PYTHON overrides).
tf_venv=${RINGFLOW_TF_VENV:-$venv/tensorflow}
make_tf_venv() {
  echo "[setup] installing tensorflow-cpu $TENSORFLOW_VERSION in $tf_venv"
  python3 -m venv "$tf_venv"
  "$tf_venv/bin/python" -m pip install --quiet --upgrade pip
  local requirements
  mapfile -t requirements < <(python3 docker/requirements_without_torch.py --core)
  "$tf_venv/bin/python" -m pip install --quiet "tensorflow-cpu==$TENSORFLOW_VERSION" "${requirements[@]}"
}
if ! "$tf_venv/bin/python" -c "import tensorflow as tf, sys; sys.exit(tf.__version__ != '$TENSORFLOW_VERSION')" \
    2>/dev/null; then
  side tensorflow make_tf_venv
fi

py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip wheel setuptools
"$py" -m pip install --quiet "torch==$TORCH_VERSION"
echo "[setup] installing ringflow and its dependencies"
"$py" -m pip install --quiet -e ".[airflow,mlflow,test]"

# Horovod's build needs the compilers and MPI headers (apt) and torch (above).
[ -n "${side_pids[apt]:-}" ] && wait_side apt
"$root"/scripts/setup-multihost.sh  # nothing left to install: checks that it is all there
# Built, or rebuilt when the installed one lacks a patch of docker/build-horovod.sh's.
if ! PYTHON="$py" docker/build-horovod.sh --installed 2>/dev/null; then
  echo "[setup] building Horovod $HOROVOD_VERSION (about 3 minutes the first time)"
  "$py" -m pip install --quiet cmake packaging psutil pyyaml cloudpickle
  PYTHON="$py" docker/build-horovod.sh "$cache/wheels"
  "$py" -m pip install --quiet --force-reinstall --no-deps "$cache"/wheels/horovod-"$HOROVOD_VERSION"-*.whl
fi
[ -n "${side_pids[tensorflow]:-}" ] && wait_side tensorflow
# tf-keras for users' Keras scripts (versions.env): --no-deps, since it requires the `tensorflow` wheel, which would
# be installed over tensorflow-cpu's files. Checked on its own, so an existing TF venv gets it without a rebuild.
if ! "$tf_venv/bin/python" -c "import tf_keras, sys; sys.exit(tf_keras.__version__ != '$TF_KERAS_VERSION')" \
    2>/dev/null; then
  echo "[setup] installing tf-keras $TF_KERAS_VERSION in $tf_venv"
  "$tf_venv/bin/python" -m pip install --quiet --no-deps "tf-keras==$TF_KERAS_VERSION"
fi
# Editable, as in $venv: the ranks run this checkout's code. After the main venv's editable install, not beside
# it: both build from the same source tree.
"$tf_venv/bin/python" -m pip install --quiet --no-deps -e .
"$venv/bin/horovodrun" --check-build
[ -n "${side_pids[mlflow]:-}" ] && wait_side mlflow
rm -f "$venv"/.ringflow-setup-*
touch "$stamp"
