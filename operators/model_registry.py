"""Versioned models in an object store, and the pointer that says which version is in production.

Layout under the registry prefix (default `models`) of a store:

    models/<name>/v<N>/<files>          copied from a training checkpoint
    models/<name>/v<N>/MODEL.json       written after the files: what was copied, from where
    models/<name>/production.json       the pointer, one object replaced whole on each change:
        {"version": N, "sha256": {file: sha}, "source_run": uri, "checkpoint": "ckpt-...",
         "metrics": {...}, "promoted_at": ISO8601, "previous": M | null, "action": "promote"|"rollback"}

Order of writes is the safety argument: files, then MODEL.json (the version is complete), then the
pointer. A crash at any point leaves the pointer on a complete version. Readers (serving) follow the
pointer and can check each file against its sha256.

No Airflow here: the operators are thin wrappers, this module is the logic and is tested on its own.
One writer per model at a time (the promote task of one DAG); the store has no compare-and-swap.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import re
import tempfile
import urllib.parse
from typing import Any

from ringflow.training.checkpoint import MANIFEST_NAME as CHECKPOINT_MANIFEST
from ringflow.training.checkpoint import CheckpointCorrupt, CheckpointManifest, CheckpointStore
from ringflow.training.store.base import ObjectNotFound, ObjectStore, join_key

log = logging.getLogger(__name__)

MODEL_FORMAT = "ringflow.model/v1"
MODEL_FILE = "MODEL.json"
POINTER_FILE = "production.json"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_VERSION_RE = re.compile(r"^v(\d+)$")


class RegistryError(ValueError):
    """The registry cannot do what was asked; the message says what to change."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


@dataclasses.dataclass(frozen=True)
class Pointer:
    """The content of production.json."""

    version: int
    sha256: dict[str, str]
    source_run: str
    checkpoint: str
    metrics: dict[str, Any]
    promoted_at: str
    previous: int | None
    action: str = "promote"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: bytes | str, where: str) -> "Pointer":
        try:
            doc = json.loads(text)
            return cls(**{f.name: doc[f.name] for f in dataclasses.fields(cls) if f.name in doc})
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
            raise RegistryError(f"{where} is not a valid production pointer ({exc}); "
                                f"restore it with rollback(name, to_version=N)") from exc


@dataclasses.dataclass(frozen=True)
class Promotion:
    name: str
    version: int
    new_version: bool  # False: an existing version already held these exact files
    pointer: Pointer
    previous: int | None  # the version in production before this call


def run_prefix_in(store_uri: str, run_uri: str) -> str:
    """The key prefix of `run_uri` inside the store rooted at `store_uri`, e.g.
    (`s3://b/ml`, `s3://b/ml/runs/7`) -> `runs/7`. Server-side copies only work inside one store,
    so a run elsewhere is an error, not a silent download."""
    def parse(uri: str) -> tuple[str, str]:
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme == "s3":
            return f"s3://{parts.netloc}", urllib.parse.unquote(parts.path).strip("/")
        if parts.scheme == "file":
            path = urllib.parse.unquote(parts.path)
        elif parts.scheme and len(parts.scheme) > 1:
            raise RegistryError(f"unsupported URI {uri!r}; use a path, file:// or s3://")
        else:
            path = os.path.expanduser(uri)
        return "file://", os.path.abspath(path).strip("/")

    store_root, store_path = parse(store_uri)
    run_root, run_path = parse(run_uri)
    inside = run_root == store_root and (not store_path or run_path.startswith(store_path + "/"))
    rel = run_path[len(store_path):].strip("/") if inside else ""
    if not rel:
        raise RegistryError(
            f"the run {run_uri!r} is not inside the registry's store {store_uri!r}: write runs under the "
            f"same bucket/folder as the models (e.g. {store_uri.rstrip('/')}/runs/<run_id>), so promotion "
            f"copies server-side"
        )
    return rel


class ModelRegistry:
    def __init__(self, store: ObjectStore, prefix: str = "models") -> None:
        self.store = store
        self.prefix = join_key(prefix)

    # -- keys -----------------------------------------------------------------------------------

    def _model_key(self, name: str, *parts: str) -> str:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise RegistryError(f"model name {name!r} must be letters, digits, '.', '_' or '-' (one path segment)")
        return join_key(self.prefix, name, *parts)

    def _version_key(self, name: str, version: int, file: str) -> str:
        return self._model_key(name, f"v{version}", file)

    # -- reading --------------------------------------------------------------------------------

    def _scan(self, name: str) -> tuple[list[int], int]:
        """(complete versions ascending, highest version number seen, complete or not)."""
        base = self._model_key(name) + "/"
        seen, complete = set(), set()
        for info in self.store.list(base + "v"):
            folder, _, file = info.key[len(base):].partition("/")
            match = _VERSION_RE.match(folder)
            if match and file:
                seen.add(int(match.group(1)))
                if file == MODEL_FILE:
                    complete.add(int(match.group(1)))
        return sorted(complete), max(seen, default=0)

    def versions(self, name: str) -> list[int]:
        """Complete versions (MODEL.json present), oldest first."""
        return self._scan(name)[0]

    def model_info(self, name: str, version: int) -> dict[str, Any]:
        """The MODEL.json of a version."""
        try:
            return json.loads(self.store.get_bytes(self._version_key(name, version, MODEL_FILE)))
        except ObjectNotFound as exc:
            raise RegistryError(
                f"model {name!r} has no complete version {version} in {self.store.uri}; "
                f"versions are {self.versions(name)}"
            ) from exc

    def production(self, name: str) -> Pointer | None:
        """The production pointer, or None before the first promotion."""
        key = self._model_key(name, POINTER_FILE)
        try:
            raw = self.store.get_bytes(key)
        except ObjectNotFound:
            return None
        return Pointer.from_json(raw, f"{self.store.uri}/{key}")

    # -- writing --------------------------------------------------------------------------------

    def promote(self, name: str, *, run_prefix: str, checkpoint: str, metrics: dict[str, Any],
                source_run: str = "", checkpoint_prefix: str = "checkpoints",
                source_store: ObjectStore | None = None) -> Promotion:
        """Copy checkpoint `checkpoint` of the run at key prefix `run_prefix` into a new version and
        point production at it.

        The normal case is one store for runs and models: files are copied server-side and only read
        once, for the sha256 check against the checkpoint MANIFEST. With `source_store` (runs in
        another store) the files go through this process: downloaded, checked, uploaded.
        Raises CheckpointCorrupt for a tampered checkpoint; the pointer is then untouched.
        """
        same_store = source_store is None
        src = self.store if same_store else source_store
        run_store = src.child(run_prefix) if run_prefix else src
        manifest = CheckpointStore(run_store, prefix=checkpoint_prefix, keep_last=None).read_manifest(checkpoint)
        wanted = {f: e.sha256 for f, e in manifest.files.items()}
        before = self.production(name)
        source_run = source_run or run_store.uri

        def src_key(file: str) -> str:  # the file's key in `src`
            return join_key(run_prefix, manifest.key(file))

        complete, highest = self._scan(name)
        infos = {v: self.model_info(name, v) for v in complete}
        # Same files (by sha256) as a version we have: a retried or repeated promote.
        existing = next((v for v in reversed(complete) if infos[v].get("sha256") == wanted), None)
        if existing is not None:
            log.info("model %s: checkpoint %s is already version %d; no new version", name, checkpoint, existing)
            version, info = existing, infos[existing]
            pointer = self._pointer_from(info, previous=before.version if before else None)
            if before is not None and before.version == existing:
                return Promotion(name, existing, False, before, before.version)
        else:
            # Never reuse a number a crashed attempt left files under: its leftovers would mix in.
            version = highest + 1
            try:
                if same_store:
                    self._copy_server_side(name, version, manifest, src_key)
                else:
                    self._copy_through(name, version, manifest, src, src_key)
            except BaseException:
                self.store.delete_prefix(self._model_key(name, f"v{version}") + "/")
                raise
            info = {
                "format": MODEL_FORMAT, "name": name, "version": version,
                "files": {f: dataclasses.asdict(e) for f, e in sorted(manifest.files.items())},
                "sha256": wanted,
                "source": {"store": src.uri, "run": source_run, "checkpoint": checkpoint,
                           "step": manifest.step, "keys": {f: src_key(f) for f in sorted(manifest.files)}},
                "checkpoint_meta": manifest.meta, "metrics": metrics, "created_at": _now(),
            }
            # MODEL.json after the files: its presence says the version is complete.
            self.store.put_bytes(self._version_key(name, version, MODEL_FILE),
                                 json.dumps(info, indent=1, sort_keys=True).encode())
            pointer = self._pointer_from(info, previous=before.version if before else None)
        self._write_pointer(name, pointer)
        log.info("model %s: production is now version %d (was %s)", name, version,
                 before.version if before else "none")
        return Promotion(name, version, existing is None, pointer, before.version if before else None)

    def rollback(self, name: str, to_version: int | None = None) -> Pointer:
        """Point production at `to_version`, or at the pointer's `previous`. Versions are never deleted.
        The new pointer's `previous` is the newest complete version below the target, so repeated
        rollbacks keep walking back instead of toggling between two versions."""
        current = self.production(name)
        if to_version is None:
            if current is None:
                raise RegistryError(f"model {name!r} has no production version to roll back from")
            if current.previous is None:
                raise RegistryError(
                    f"model {name!r} version {current.version} has no previous version to roll back to; "
                    f"pass to_version (versions: {self.versions(name)})"
                )
            to_version = current.previous
        info = self.model_info(name, to_version)  # raises RegistryError for an unknown version
        older = [v for v in self.versions(name) if v < to_version]
        pointer = self._pointer_from(info, previous=older[-1] if older else None, action="rollback")
        self._write_pointer(name, pointer)
        log.info("model %s: rolled back production from version %s to %d", name,
                 current.version if current else "none", to_version)
        return pointer

    # -- helpers --------------------------------------------------------------------------------

    def _pointer_from(self, info: dict[str, Any], previous: int | None, action: str = "promote") -> Pointer:
        return Pointer(version=int(info["version"]), sha256=dict(info["sha256"]),
                       source_run=info["source"]["run"], checkpoint=info["source"]["checkpoint"],
                       metrics=dict(info.get("metrics") or {}), promoted_at=_now(),
                       previous=previous, action=action)

    def _write_pointer(self, name: str, pointer: Pointer) -> None:
        # One put: readers see the old pointer or the new one, never a mix.
        self.store.put_bytes(self._model_key(name, POINTER_FILE), pointer.to_json().encode())

    def _copy_server_side(self, name: str, version: int, manifest: CheckpointManifest, src_key) -> None:
        # Sizes first, from metadata only: a truncated file is refused before anything is copied.
        for file, entry in manifest.files.items():
            try:
                size = self.store.stat(src_key(file)).size
            except ObjectNotFound as exc:
                raise CheckpointCorrupt(f"checkpoint {manifest.name}: file {file!r} is missing; "
                                        f"promote another checkpoint") from exc
            if size != entry.size:
                raise CheckpointCorrupt(
                    f"checkpoint {manifest.name}: file {file!r} has {size} bytes, its {CHECKPOINT_MANIFEST} "
                    f"says {entry.size} (truncated or replaced); refusing to promote it"
                )
        for file in manifest.files:
            self.store.copy(src_key(file), self._version_key(name, version, file))
        # Check the copies, not the sources: this proves the bytes that will be served are the ones
        # training saved, even if the source changed between the checks and the copy.
        for file in manifest.files:
            data = self.store.get_bytes(self._version_key(name, version, file))
            _check_sha(manifest, file, len(data), hashlib.sha256(data).hexdigest())

    def _copy_through(self, name: str, version: int, manifest: CheckpointManifest, src: ObjectStore,
                      src_key) -> None:
        with tempfile.TemporaryDirectory(prefix="ringflow-promote-") as tmp:
            for file in manifest.files:
                local = os.path.join(tmp, file)
                try:
                    src.get_file(src_key(file), local)
                except ObjectNotFound as exc:
                    raise CheckpointCorrupt(f"checkpoint {manifest.name}: file {file!r} is missing; "
                                            f"promote another checkpoint") from exc
                with open(local, "rb") as f:
                    digest = hashlib.file_digest(f, "sha256").hexdigest()
                _check_sha(manifest, file, os.path.getsize(local), digest)
                self.store.put_file(self._version_key(name, version, file), local)
                os.unlink(local)


def _check_sha(manifest: CheckpointManifest, file: str, size: int, actual: str) -> None:
    entry = manifest.files[file]
    if size != entry.size or actual != entry.sha256:
        raise CheckpointCorrupt(
            f"checkpoint {manifest.name}: file {file!r} has sha256 {actual[:12]}… ({size} bytes), its "
            f"{CHECKPOINT_MANIFEST} says {entry.sha256[:12]}… ({entry.size} bytes): it was modified after "
            f"training saved it; refusing to promote it. Promote another checkpoint or retrain"
        )
