#!/usr/bin/env bash
# Installs what the multi-host tests (tests/multihost) and scripts/build-training-image.sh need on a Debian
# host, unattended and idempotent: buildah (builds the image with --isolation chroot and mounts it),
# debootstrap (its Debian base), iproute2 (network namespaces and veth pairs), util-linux's unshare and
# procps. sshd, ssh and mpirun come from the image, not from the host. A second run does nothing.
# Needs root, as the tests do (namespaces, chroot, buildah's storage).
# `--missing` prints the Debian packages still to install and installs nothing: scripts/setup.sh folds them
# into its one apt transaction.
set -euo pipefail
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v ip >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
command -v pkill >/dev/null || need+=(procps)
if [ "${1:-}" = --missing ]; then
  echo "${need[*]}"
  exit 0
fi
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
echo "[setup-multihost] installing ${need[*]} from Debian"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
