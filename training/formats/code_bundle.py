"""The user's code bundle: the script's folder packed as a tar.gz in the run folder (code/<sha256>.tar.gz), its
sha256 pinned in the job config by whoever launches the job (`pin_entry`: the train operator, `ringflow train`),
and checked by every rank before it runs anything (`fetch_bundle`), so no code runs that the control plane did
not name. Torch-free, Airflow-free.

The pack is reproducible (sorted names, zeroed times and owners, no compression timestamp): the same folder
gives the same sha256, so a retry or a second launch of the same code writes nothing new. Caches and hidden
files (`__pycache__`, `.git`, `*.pyc`) are left out. What the script imports beyond its folder is the image's
business (the packages installed there), not the bundle's.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile

from ..store import ObjectNotFound, ObjectStore
from .config import EntryConfig, JobConfig

CODE_PREFIX = "code/"
# The folder of training scripts a trigger form may pick from (one script per subfolder): where a DAG looks
# when it does not say (its own scripts/ folder by default).
SCRIPTS_DIR_ENV = "RINGFLOW_SCRIPTS_DIR"
# A bundle is code, not data: a folder bigger than this is almost surely holding a dataset or a model by mistake.
MAX_BUNDLE_BYTES = 64 * 2**20
_SKIPPED_DIRS = {"__pycache__", ".git", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache"}


class BundleError(ValueError):
    """The code bundle cannot be made or is not the one the config pinned; the message says what to do."""


def bundle_key(sha256: str) -> str:
    return f"{CODE_PREFIX}{sha256}.tar.gz"


def _files(folder: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")) or name.startswith("."):
                continue
            found.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(found)


def pack(folder: str) -> bytes:
    """The folder's files as a reproducible tar.gz; BundleError for a folder that is missing, empty or too big."""
    if not os.path.isdir(folder):
        raise BundleError(f"entry.folder {folder!r} is not a folder: give the folder holding the training script")
    files = _files(folder)
    total = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    if total > MAX_BUNDLE_BYTES:
        raise BundleError(f"entry.folder {folder!r} holds {total / 2**20:.0f} MiB (more than "
                          f"{MAX_BUNDLE_BYTES // 2**20} MiB): keep data and models out of the code folder "
                          "(data comes through the manifest, weights through checkpoints)")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in files:
            path = os.path.join(folder, name)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = os.path.getsize(path), 0o644, 0
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def scripts_dir(default: str) -> str:
    """The configured scripts folder: $RINGFLOW_SCRIPTS_DIR, else `default`."""
    return os.environ.get(SCRIPTS_DIR_ENV) or default


def scripts_in(folder: str, script: str) -> list[str]:
    """The script folders a form may offer: the subfolders of `folder` that hold `script` (hidden and cache
    folders left out), sorted; none when `folder` does not exist."""
    if not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name, script))
                  and name not in _SKIPPED_DIRS and not name.startswith((".", "_")))


def script_folder(folder: str, name: str, script: str) -> str:
    """The path of script folder `name` in the scripts folder `folder`; BundleError for a name that is not one
    of its subfolders holding `script` (a path, `..`, a name never there): a form picks a script, never a path."""
    offered = scripts_in(folder, script)
    if name not in offered:
        raise BundleError(f"script {name!r} is not one of the scripts in {folder} ({', '.join(offered) or 'none'}): "
                          f"pick one of them, or add its folder there with its {script} (${SCRIPTS_DIR_ENV} names "
                          "the folder)")
    return os.path.join(folder, name)


def pin_entry(cfg: JobConfig, run_store: ObjectStore, relative_to: str | None = None) -> JobConfig:
    """`cfg` with its entry's folder packed into the run folder and its sha256 pinned (the folder dropped); `cfg`
    unchanged when it has no folder to pack (ringflow's loop, a path in the image, or pinned already: then its
    bundle is checked here, so a swapped one is refused before any rank starts).
    relative_to: the folder a relative entry.folder is relative to (the config file's); else the working one."""
    entry = cfg.entry
    if entry is None or entry.folder is None:
        if entry is not None and entry.bundle_sha256 is not None:
            read_bundle(entry, run_store)  # pinned already: refused here, before any rank starts, if not that code
        return cfg
    folder = os.path.join(relative_to, entry.folder) if relative_to else entry.folder
    script = os.path.join(folder, entry.script)
    if not os.path.isfile(script):
        raise BundleError(f"entry.script {entry.script!r} is not a file in entry.folder {folder!r}: give "
                          "the script's path inside the folder")
    data = pack(folder)
    digest = sha256_of(data)
    if _stored_sha256(run_store, bundle_key(digest)) != digest:  # a retry of the same code writes nothing
        run_store.put_bytes(bundle_key(digest), data)  # content-addressed: anything else there was never this code
    return dataclasses.replace(cfg, entry=dataclasses.replace(entry, folder=None, bundle_sha256=digest))


def _stored_sha256(store: ObjectStore, key: str) -> str | None:
    try:
        return sha256_of(store.get_bytes(key))
    except ObjectNotFound:
        return None


def read_bundle(entry: EntryConfig, run_store: ObjectStore) -> bytes:
    """The pinned bundle's bytes, read from the run folder and checked against the sha256 the config pinned.
    BundleError for a bundle missing or not the pinned one (planted, swapped, changed after it was pinned)."""
    digest = entry.bundle_sha256
    try:
        data = run_store.get_bytes(bundle_key(digest))
    except ObjectNotFound:
        raise BundleError(f"the code bundle {run_store.uri}/{bundle_key(digest)} is missing: launch the job again "
                          "(the launch writes it)") from None
    got = sha256_of(data)
    if got != digest:
        raise BundleError(f"the code bundle {run_store.uri}/{bundle_key(digest)} has sha256 {got[:12]}..., not the "
                          f"{digest[:12]}... the job config pinned: it was changed after the launch; refused, "
                          "nothing of it ran. Launch the job again to pin the code as it is now")
    return data


def fetch_bundle(entry: EntryConfig, run_store: ObjectStore, into: str | None = None) -> str:
    """The pinned bundle read from the run folder, checked against its sha256 (read_bundle) and unpacked into a
    new folder (under `into`, else the temp folder); that folder. BundleError, before anything of it runs, for a
    bundle missing or not the pinned one, or an entry never pinned."""
    if entry.folder is not None:
        raise BundleError(f"entry.folder {entry.folder!r} was never packed: launch the job with ringflow train or "
                          "the train operator, which pin the code's bundle")
    data = read_bundle(entry, run_store)
    folder = tempfile.mkdtemp(prefix="ringflow-code-", dir=into)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(folder, filter="data")  # no links out, no absolute paths, no devices
    except tarfile.TarError as exc:  # pinned, yet not a bundle pack() made: nothing of it runs
        shutil.rmtree(folder, ignore_errors=True)
        raise BundleError(f"the code bundle {run_store.uri}/{bundle_key(entry.bundle_sha256)} is not a plain "
                          f"folder's pack ({exc}); refused, nothing of it ran. Launch the job again from the "
                          "script's folder to pin a bundle ringflow packed") from None
    return folder
