#!/usr/bin/env bash
# Builds a Horovod wheel from the PyPI sdist, with PyTorch and both the Gloo and MPI controllers.
#
# Why a patch: Horovod 0.28.1 (the last release) compiles its C++ with CMAKE_CXX_STANDARD 14, and
# torch >= 2.1 headers need C++17, so the sdist fails to build against any current torch. Upstream fixed
# this in horovod/horovod#3998 (raise the standard to 17 in CMakeLists.txt and horovod/torch/CMakeLists.txt)
# after 0.28.1, and never released it. We apply exactly that change to the released sdist.
#
# A second patch, ringflow's own ("gloo-op-timeout"): Horovod bounds both a Gloo rendezvous (the survivors
# of an elastic job waiting for a joining worker, still importing torch) and every collective (a survivor
# waiting on a peer that died) with one timeout, HOROVOD_GLOO_TIMEOUT_SECONDS. A long one makes a survivor
# that was not talking to the dead peer wait that long before it recovers; a short one fails joins on a
# loaded host (docs/guides/reliability.md). The patch gives collectives a timeout of their own: once a
# context is connected, it waits on a silent peer HOROVOD_GLOO_OP_TIMEOUT_SECONDS (when set, in seconds,
# fractions allowed); the rendezvous keeps HOROVOD_GLOO_TIMEOUT_SECONDS.
#
# A third, ringflow's own ("gloo-finalize-process-sets"): every process set (set 0 included) owns a
# GlooContext whose contexts the Gloo controller and its collectives use, but only the global one is ever
# enabled, and GlooContext::Finalize() returned at once for a context not enabled: at hvd.shutdown() the
# process sets' TCP pairs stayed connected. In an elastic job of 3 or more workers, a survivor that had
# noticed a death shut down, yet its socket to a survivor that had not stayed open, so that one waited the
# whole op timeout in its ring receive (seen here: the third worker of 3 recovered after 20 s instead of
# under 1 s, 3 runs in 13). The patch releases every context in Finalize(), enabled or not, so the pairs
# close and the peer is told at once ("Connection closed by peer").
#
# The built package lists its patches in horovod.RINGFLOW_PATCHES, which the rank reads
# (training/rank/engines/horovod.py) and a wheel is reused by.
#
# Used by scripts/setup.sh (local machine) and docker/training.Dockerfile (the image), so both build
# Horovod the same way.
#
# usage: build-horovod.sh OUT_DIR [EXTRA_ENV...]   (needs torch and cmake already installed in the python)
#        build-horovod.sh --installed              (exit 0 when the python's Horovod carries these patches)
#
# GPU builds: HOROVOD_GPU_OPERATIONS=NCCL (with HOROVOD_CUDA_HOME, HOROVOD_NCCL_LINK) in the environment, as
# the training image's GPU=1 build sets them; Horovod's setup reads them. A wheel already in OUT_DIR is reused
# only when it was built for the same GPU operations (noted beside it), so a CPU wheel never stands in
# for a GPU one or the other way round.
set -euo pipefail
out_dir=${1:?usage: build-horovod.sh OUT_DIR}
python=${PYTHON:-python}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC1091
source "$here/versions.env"
# What this script changes in the sdist, as the built package lists it (horovod.RINGFLOW_PATCHES).
patches='("cxx17", "gloo-op-timeout", "gloo-finalize-process-sets")'
marker="RINGFLOW_PATCHES = $patches"

if [ "$out_dir" = --installed ]; then
  exec "$python" -c 'import ast, sys, horovod, horovod.torch; sys.exit(getattr(horovod, "RINGFLOW_PATCHES", None) != ast.literal_eval(sys.argv[1]))' \
    "$patches"
fi

mkdir -p "$out_dir"
gpu_ops=${HOROVOD_GPU_OPERATIONS:-}
# No note: a wheel from before notes were kept, or the wheelhouse's, both CPU builds.
note="$out_dir/horovod-$HOROVOD_VERSION.gpu-operations"
built_for=$(cat "$note" 2>/dev/null || true)
carries_patches() {  # the wheel's own horovod/__init__.py lists this script's patches
  "$python" -c 'import sys, zipfile; sys.exit(sys.argv[2] not in zipfile.ZipFile(sys.argv[1]).read("horovod/__init__.py").decode())' \
    "$1" "$marker" 2>/dev/null
}
if ls "$out_dir"/horovod-"$HOROVOD_VERSION"-*.whl >/dev/null 2>&1; then
  wheel=$(ls "$out_dir"/horovod-"$HOROVOD_VERSION"-*.whl | head -1)
  if [ "$built_for" != "$gpu_ops" ]; then
    echo "the horovod wheel in $out_dir was built for GPU operations '${built_for:-none}', not '${gpu_ops:-none}': rebuilding"
  elif ! carries_patches "$wheel"; then
    echo "the horovod wheel in $out_dir lacks this script's patches $patches: rebuilding"
  else
    echo "horovod wheel already built in $out_dir (GPU operations: ${gpu_ops:-none})"
    exit 0
  fi
  rm -f "$out_dir"/horovod-"$HOROVOD_VERSION"-*.whl
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" || { echo "C++17 patch did not apply" >&2; exit 1; }
# The gloo-op-timeout patch (the header): after a context's rendezvous, its collectives' timeout.
"$python" - "$src" "$marker" <<'PATCH'
import pathlib, sys
src, marker = pathlib.Path(sys.argv[1]), sys.argv[2]
context = src / "horovod/common/gloo/gloo_context.cc"
text = context.read_text()
connected = "  store->Finalize();\n  return context;\n"
if text.count(connected) != 1:
    sys.exit("gloo-op-timeout patch did not apply: Rendezvous() in gloo_context.cc has changed")
context.write_text(text.replace(connected, """  store->Finalize();
  // ringflow's gloo-op-timeout patch: connected, the context's collectives wait on a silent peer
  // HOROVOD_GLOO_OP_TIMEOUT_SECONDS when it is set, not the rendezvous's timeout.
  const char* op_timeout = std::getenv("HOROVOD_GLOO_OP_TIMEOUT_SECONDS");
  double op_seconds = op_timeout != nullptr ? std::strtod(op_timeout, nullptr) : 0.0;
  if (op_seconds > 0) {
    context->setTimeout(std::chrono::milliseconds(static_cast<long long>(op_seconds * 1000)));
  }
  return context;
"""))
# The gloo-finalize-process-sets patch: Finalize() releases the contexts whether or not it was enabled.
text = context.read_text()
finalize = """void GlooContext::Finalize() {
  if (!enabled_) {
    return;
  }

  global_ctx.reset();
  ctx.reset();
  cross_ctx.reset();
  local_ctx.reset();
  reset_ = true;
}
"""
if text.count(finalize) != 1:
    sys.exit("gloo-finalize-process-sets patch did not apply: Finalize() in gloo_context.cc has changed")
context.write_text(text.replace(finalize, """void GlooContext::Finalize() {
  // ringflow's gloo-finalize-process-sets patch: a process set's context is never enabled, yet its pairs
  // must close at shutdown, or a peer waits out its receive on this rank.
  global_ctx.reset();
  ctx.reset();
  cross_ctx.reset();
  local_ctx.reset();
  if (!enabled_) {
    return;
  }
  reset_ = true;
}
"""))
init = src / "horovod/__init__.py"
init.write_text(init.read_text() + "\n# Patched by ringflow's docker/build-horovod.sh\n" + marker + "\n")
PATCH

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=${HOROVOD_WITH_MPI:-1}
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
# CMake 4 (what `pip install cmake` gives today) refuses projects declaring cmake_minimum_required < 3.5, as
# Horovod's bundled gloo does ("Compatibility with CMake < 3.5 has been removed"); this lets it configure.
# Older CMake ignores the variable.
export CMAKE_POLICY_VERSION_MINIMUM=${CMAKE_POLICY_VERSION_MINIMUM:-3.5}
export MAKEFLAGS="-j$(nproc)"
# --no-build-isolation: the extension must compile against the torch already installed, not a fresh one.
"$python" -m pip wheel --no-build-isolation --no-deps "$src" -w "$out_dir"
printf '%s' "$gpu_ops" > "$note"
