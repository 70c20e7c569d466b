"""The training image, built once per test session, mounted, and made into hosts (tests/multihost/hosts.py).

The image is tagged with a hash of everything that goes into it (the Dockerfile, its scripts, versions,
ringflow's code and the host's Horovod wheel), so a rerun with nothing changed reuses it, and a change
rebuilds only the layers after it (buildah --layers). Needs root: namespaces, chroot, buildah's storage.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from hosts import ImageRoot, sh

ROOT = Path(__file__).resolve().parents[2]
IMAGE_REPO = "localhost/ringflow-training"
CACHE = Path(os.environ.get("RINGFLOW_CACHE", Path.home() / ".cache" / "ringflow"))
# What COPY puts into the image, plus how it is built.
IMAGE_INPUTS = ["docker/training.Dockerfile", "docker/training.Dockerfile.dockerignore", "docker/build-horovod.sh",
                "docker/sshd_config", "docker/requirements_without_torch.py", "versions.env", "pyproject.toml",
                "README.md", "scripts/build-training-image.sh", "training", "operators"]


def image_hash() -> str:
    digest = hashlib.sha256()
    for name in IMAGE_INPUTS:
        path = ROOT / name
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if path.is_dir() else [path]
        for f in files:
            digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    for wheel in sorted(CACHE.glob("wheels/horovod-*.whl")):
        digest.update(f"{wheel.name}:{wheel.stat().st_size}".encode())
    return digest.hexdigest()[:16]


CONTAINER_PREFIX = "rfmh-"


def _remove_stale_containers() -> None:
    """Containers left mounted by a test session that was killed (named rfmh-<pid>-<random>)."""
    names = sh("buildah", "containers", "--format", "{{.ContainerName}}", check=False).stdout.split()
    for name in names:
        parts = name.split("-")
        if name.startswith(CONTAINER_PREFIX) and len(parts) == 3 and parts[1].isdigit():
            try:
                os.kill(int(parts[1]), 0)
                continue  # its session is alive
            except ProcessLookupError:
                pass
            sh("buildah", "umount", name, check=False)
            sh("buildah", "rm", name, check=False)


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("multi-host tests need root (network namespaces, chroot, buildah); CI runs them as root")


@pytest.fixture(scope="session")
def training_image() -> str:
    """The tag of the training image built from this tree (built now if it is not there yet)."""
    _require_root()
    subprocess.run([str(ROOT / "scripts/setup-multihost.sh")], check=True)
    tag = f"{IMAGE_REPO}:test-{image_hash()}"
    if sh("buildah", "inspect", "--type", "image", tag, check=False).returncode != 0:
        CACHE.mkdir(parents=True, exist_ok=True)
        log = CACHE / "build-training-image.log"
        with open(log, "wb") as out:
            # MPIJobs only: no TensorFlow venv, which would only add a TensorFlow download to the build.
            proc = subprocess.run(["nice", "-n", "10", str(ROOT / "scripts/build-training-image.sh"), tag],
                                  stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=3600,
                                  env=os.environ | {"RINGFLOW_IMAGE_TENSORFLOW": "0"})
        if proc.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            pytest.fail(f"scripts/build-training-image.sh {tag} failed ({proc.returncode}), {log}:\n{tail}")
        # Older test images are superseded: keep the disk from filling up with them.
        for image in sh("buildah", "images", "--format", "{{.Name}}:{{.Tag}}", check=False).stdout.split():
            if image.startswith(f"{IMAGE_REPO}:test-") and image != tag:
                sh("buildah", "rmi", image, check=False)
    return tag


@pytest.fixture(scope="session")
def image_root(training_image) -> ImageRoot:
    """The image mounted read-write through a container of its own (removed afterwards)."""
    _remove_stale_containers()
    ctr = sh("buildah", "from", "--pull-never", "--name", f"{CONTAINER_PREFIX}{os.getpid()}-{os.urandom(3).hex()}",
             training_image).stdout.strip().splitlines()[-1]
    try:
        mount = Path(sh("buildah", "mount", ctr).stdout.strip())
        config = json.loads(sh("buildah", "inspect", "--type", "image", training_image).stdout)
        env = dict(item.split("=", 1) for item in (config["Docker"]["config"].get("Env") or []))
        yield ImageRoot(path=mount, env=env)
    finally:
        sh("buildah", "umount", ctr, check=False)
        sh("buildah", "rm", ctr, check=False)
