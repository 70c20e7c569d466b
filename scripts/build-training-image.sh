#!/usr/bin/env bash
# Builds the training image (docker/training.Dockerfile) on a machine without Docker or a registry:
# buildah with --isolation chroot, a Debian bookworm base made with debootstrap, and a local wheelhouse.
#
#   scripts/build-training-image.sh [TAG]          (default TAG: localhost/ringflow-training:dev)
#
# Steps, each skipped when its result is already there:
#  1. debootstrap Debian bookworm (minbase) once into $RINGFLOW_CACHE/base (default ~/.cache/ringflow), and
#     import it into buildah's storage as localhost/ringflow-base:debian-<version>-minbase (BASE_IMAGE).
#  2. docker/wheelhouse/: the torch wheel and its dependencies (pip download; the PyTorch CPU index first,
#     else pip's own configuration) and, unless RINGFLOW_HOROVOD_WHEEL=build, the Horovod wheel that
#     scripts/setup.sh built on this host (the host must be Debian bookworm too: same Python minor, glibc
#     and OpenMPI as the image).
#  3. buildah bud with the versions from versions.env and the host's CA bundle as the build secret
#     ca_bundle (RINGFLOW_CA_BUNDLE; for TLS-intercepting proxies). A secret never lands in a layer.
#     RINGFLOW_IMAGE_TENSORFLOW=0 leaves the TensorFlow venv out (TrainJobs of engine tensorflow need it).
# Needs root (debootstrap, buildah's chroot isolation): scripts/setup-multihost.sh installs the tools.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck disable=SC1091
source versions.env
tag=${1:-localhost/ringflow-training:dev}
cache=${RINGFLOW_CACHE:-$HOME/.cache/ringflow}
mirror=${RINGFLOW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
ca_bundle=${RINGFLOW_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
horovod_wheel=${RINGFLOW_HOROVOD_WHEEL:-auto}   # auto: the host's wheel if there is one; build: compile in the image
pip=${RINGFLOW_HOST_PIP:-python3 -m pip}
tensorflow=${RINGFLOW_IMAGE_TENSORFLOW:-1}   # 0: no TF venv in the image (an image for MPIJobs only)
log() { echo "[build-training-image] $*" >&2; }

# 1. The base image.
base_dir="$cache/base"
base_tar="$base_dir/bookworm-minbase.tar"
if [ ! -s "$base_tar" ]; then
  log "debootstrap Debian bookworm (minbase) from $mirror (a few minutes, once)"
  mkdir -p "$base_dir"
  work=$(mktemp -d "$base_dir/rootfs.XXXXXX")
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$base_dir/debootstrap.log" 2>&1 \
    || { tail -20 "$base_dir/debootstrap.log" >&2; rm -rf "$work"; exit 1; }
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" --numeric-owner -cf "$base_tar.tmp" .
  mv "$base_tar.tmp" "$base_tar"
  rm -rf "$work"
fi
debian_version=$(tar -xOf "$base_tar" ./etc/debian_version)
base_image="localhost/ringflow-base:debian-${debian_version}-minbase"
if ! buildah inspect --type image "$base_image" >/dev/null 2>&1; then
  log "importing $base_tar as $base_image"
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  tar -C "$mnt" --numeric-owner -xf "$base_tar"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$ctr"
  buildah commit --quiet "$ctr" "$base_image" >/dev/null
  buildah rm "$ctr" >/dev/null
fi

# 2. The wheelhouse (hard links into docker/wheelhouse/, which git ignores; a copy across file systems).
wheel_cache="$cache/wheelhouse/torch-$TORCH_VERSION"
if ! ls "$wheel_cache"/torch-"$TORCH_VERSION"[-+]*.whl >/dev/null 2>&1; then
  log "downloading torch $TORCH_VERSION and its dependencies into $wheel_cache"
  mkdir -p "$wheel_cache"
  $pip download --quiet --only-binary :all: --retries 1 --timeout 20 -d "$wheel_cache" \
      --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple "torch==$TORCH_VERSION" \
    || $pip download --quiet --only-binary :all: -d "$wheel_cache" "torch==$TORCH_VERSION"
fi
ls "$wheel_cache"/torch-"$TORCH_VERSION"+cpu-*.whl >/dev/null 2>&1 \
  || log "warning: the torch wheel in $wheel_cache is not a +cpu build; the image will carry CUDA libraries"
find docker/wheelhouse -name '*.whl' -delete
link() { ln -f "$1" docker/wheelhouse/ 2>/dev/null || cp -f "$1" docker/wheelhouse/; }
for whl in "$wheel_cache"/*.whl; do link "$whl"; done
if [ "$horovod_wheel" = auto ]; then
  for whl in "$cache"/wheels/horovod-"$HOROVOD_VERSION"-cp*.whl; do
    [ -e "$whl" ] && { log "using the host-built $(basename "$whl")"; link "$whl"; }
  done
elif [ "$horovod_wheel" != build ]; then
  log "RINGFLOW_HOROVOD_WHEEL is '$horovod_wheel'; use auto or build"; exit 2
fi

# 3. The image.
secret=()
if [ -s "$ca_bundle" ]; then secret=(--secret "id=ca_bundle,src=$ca_bundle"); fi
log "building $tag on $base_image"
buildah bud --isolation chroot --layers --format docker --force-rm \
  -f docker/training.Dockerfile --ignorefile docker/training.Dockerfile.dockerignore \
  --build-arg "BASE_IMAGE=$base_image" --build-arg "PYTHON_VERSION=$PYTHON_VERSION" \
  --build-arg "TORCH_VERSION=$TORCH_VERSION" --build-arg "HOROVOD_VERSION=$HOROVOD_VERSION" \
  --build-arg "TENSORFLOW_VERSION=$TENSORFLOW_VERSION" --build-arg "TF_KERAS_VERSION=$TF_KERAS_VERSION" \
  --build-arg "TENSORFLOW=$tensorflow" \
  "${secret[@]}" -t "$tag" .
log "built $tag"
