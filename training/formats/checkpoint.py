"""Training checkpoints in an object store, safe against crashes and partial uploads.

Layout under the run store:

    checkpoints/ckpt-000000040/state.pt        one object per file, written first
    checkpoints/ckpt-000000040/MANIFEST.json   written last: its presence makes the checkpoint complete

    {"format": "ringflow.checkpoint/v1", "step": 40,
     "files": {"state.pt": {"sha256": "...", "size": 123}}, "meta": {...}, "created_at": "ISO8601"}

A worker killed mid-save leaves files but no MANIFEST, and is ignored. A file that was truncated or
replaced after the MANIFEST (a disk problem, a half-finished manual copy) fails its size or sha256,
and `latest_valid` falls back to the previous checkpoint instead of resuming from garbage.
Step numbers are zero-padded so that names sort like steps in any listing.

State arrives as bytes already serialised by the caller; this module never imports torch.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import re
import warnings
from typing import Any, Callable, Mapping

from ..store.base import ObjectNotFound, ObjectStore, Progress, check_key, join_key

FORMAT = "ringflow.checkpoint/v1"
MANIFEST_NAME = "MANIFEST.json"
_NAME_RE = re.compile(r"^ckpt-(\d{9,})$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

log = logging.getLogger(__name__)


class CheckpointCorrupt(ValueError):
    """A checkpoint's manifest is malformed or one of its files does not match the manifest."""


class CheckpointOfAnotherEngine(ValueError):
    """A checkpoint of the run that another engine family wrote (the torch engines' state.pt, TensorFlow's
    model.npz): refused, not skipped like a corrupt one, which would start the run over without a word."""


def require_file(loaded: "LoadedCheckpoint", name: str, where: str, engine: str) -> bytes:
    """`name` of `loaded`, which the `engine` rank resumes from; CheckpointOfAnotherEngine when the checkpoint
    does not hold it. Its manifest lists every file its writer wrote, so a missing one is another writer's
    checkpoint (a file listed but gone is found by the load, as corrupt)."""
    if name not in loaded.files:
        raise CheckpointOfAnotherEngine(
            f"{where} holds {sorted(loaded.files)}, not {name}: another engine wrote it (horovod and ddp write "
            f"state.pt, tensorflow model.npz), so engine {engine!r} cannot resume it; resume with the engine "
            "that wrote it, or give this job a new run_uri")
    return loaded.files[name]


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped while looking for one to resume from."""


@dataclasses.dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint a resume passed over, and why (corrupt, unsafe, missing): recorded in the run's result."""

    name: str
    reason: str


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}"


def step_of(name: str) -> int:
    match = _NAME_RE.match(name)
    if not match:
        raise ValueError(f"{name!r} is not a checkpoint name like 'ckpt-000000040'")
    return int(match.group(1))


@dataclasses.dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int


@dataclasses.dataclass(frozen=True)
class CheckpointManifest:
    name: str
    step: int
    files: dict[str, FileEntry]
    meta: dict[str, Any]
    created_at: str
    prefix: str = "checkpoints"  # where the checkpoint lives in its store; not part of the JSON

    def key(self, file: str) -> str:
        """The file's key in the run store, e.g. for a server-side copy when promoting."""
        if file != MANIFEST_NAME and file not in self.files:
            raise KeyError(f"{file!r} is not a file of checkpoint {self.name}")
        return join_key(self.prefix, self.name, file)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT,
            "step": self.step,
            "files": {f: dataclasses.asdict(e) for f, e in sorted(self.files.items())},
            "meta": self.meta,
            "created_at": self.created_at,
        }, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, name: str, text: bytes | str, prefix: str = "checkpoints") -> "CheckpointManifest":
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointCorrupt(f"checkpoint {name}: {MANIFEST_NAME} is not valid JSON ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else None
            raise CheckpointCorrupt(f"checkpoint {name}: {MANIFEST_NAME} format is {found!r}, expected {FORMAT!r}")
        try:
            step = doc["step"]
            files = {f: FileEntry(sha256=e["sha256"], size=e["size"]) for f, e in doc["files"].items()}
            meta, created_at = doc["meta"], doc["created_at"]
        except (KeyError, TypeError, AttributeError) as exc:
            raise CheckpointCorrupt(f"checkpoint {name}: {MANIFEST_NAME} lacks or mangles a field ({exc!r})") from exc
        if not isinstance(step, int) or step != step_of(name):
            raise CheckpointCorrupt(f"checkpoint {name}: {MANIFEST_NAME} says step {step!r}, the name says otherwise")
        for f, e in files.items():
            if not isinstance(e.size, int) or e.size < 0 or not isinstance(e.sha256, str) \
                    or not _SHA256_RE.match(e.sha256):
                raise CheckpointCorrupt(f"checkpoint {name}: {MANIFEST_NAME} entry for {f!r} is malformed")
        return cls(name=name, step=step, files=files, meta=meta, created_at=created_at, prefix=prefix)


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
    manifest: CheckpointManifest
    files: dict[str, bytes]

    @property
    def step(self) -> int:
        return self.manifest.step


class CheckpointStore:
    def __init__(self, store: ObjectStore, prefix: str = "checkpoints", keep_last: int | None = 3) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be at least 1 (or None to keep all), got {keep_last}")
        self.store = store
        self.prefix = join_key(prefix)
        if self.prefix:
            check_key(self.prefix)
        self.keep_last = keep_last

    def _key(self, name: str, file: str) -> str:
        return join_key(self.prefix, name, file)

    # -- writing --------------------------------------------------------------------------------

    def save(self, step: int, files: dict[str, bytes], meta: dict[str, Any]) -> str:
        """Write a checkpoint from bytes in memory, MANIFEST last, then prune. Returns its name."""
        for file, data in files.items():
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"checkpoint file {file!r} must be bytes (serialise it first), got {type(data).__name__}")
        return self._save(step, {f: (lambda key, d=bytes(d): self.store.put_bytes(key, d), _entry_of_bytes(bytes(d)))
                                 for f, d in files.items()}, meta)

    def save_files(self, step: int, paths: Mapping[str, str], meta: dict[str, Any],
                   progress: Progress | None = None) -> str:
        """Write a checkpoint from local files (what the background writer serialised: nothing of it held in
        memory twice), MANIFEST last, then prune. `progress` gets the bytes uploaded. Returns its name."""
        return self._save(step, {f: (lambda key, p=p: self.store.put_file(key, p, progress=progress),
                                     _entry_of_file(p)) for f, p in paths.items()}, meta)

    def _save(self, step: int, files: Mapping[str, tuple[Callable[[str], None], "FileEntry"]],
              meta: dict[str, Any]) -> str:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if not files:
            raise ValueError("a checkpoint needs at least one file")
        for file in files:
            if "/" in file or file == MANIFEST_NAME:
                raise ValueError(f"checkpoint file name {file!r} must be a plain name other than {MANIFEST_NAME}")
            check_key(file)
        json.dumps(meta)  # fail before writing anything if meta is not JSON

        name = checkpoint_name(step)
        # Saving a step again (a retried task) must not leave a window where the old MANIFEST
        # vouches for new, half-written files: take the checkpoint out of "complete" first.
        self.store.delete(self._key(name, MANIFEST_NAME))
        entries = {}
        for file, (upload, entry) in files.items():
            upload(self._key(name, file))
            entries[file] = entry
        manifest = CheckpointManifest(
            name=name, step=step, files=entries, meta=meta, prefix=self.prefix,
            created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
        )
        self.store.put_bytes(self._key(name, MANIFEST_NAME), manifest.to_json().encode())
        self.prune()
        return name

    def prune(self) -> None:
        """Keep the newest `keep_last` complete checkpoints; drop incomplete leftovers older than the
        newest complete one. Incomplete ones that are newer may be a save in progress: left alone."""
        complete, incomplete = self._scan()
        if not complete:
            return
        newest = complete[0]
        doomed = complete[self.keep_last:] if self.keep_last is not None else []
        doomed += [n for n in incomplete if step_of(n) < step_of(newest)]
        for name in doomed:
            # MANIFEST first, so a reader racing the prune sees "incomplete", not "corrupt".
            self.store.delete(self._key(name, MANIFEST_NAME))
            self.store.delete_prefix(join_key(self.prefix, name) + "/")

    # -- reading --------------------------------------------------------------------------------

    def _scan(self) -> tuple[list[str], list[str]]:
        """(complete, incomplete) checkpoint names, newest first."""
        seen: dict[str, bool] = {}
        base = f"{self.prefix}/" if self.prefix else ""
        for info in self.store.list(base + "ckpt-"):
            name, _, file = info.key[len(base):].partition("/")
            if not file or not _NAME_RE.match(name):
                continue
            seen[name] = seen.get(name, False) or file == MANIFEST_NAME
        ordered = sorted(seen, key=step_of, reverse=True)
        return [n for n in ordered if seen[n]], [n for n in ordered if not seen[n]]

    def names(self) -> list[str]:
        """Complete checkpoints (MANIFEST present), newest first."""
        return self._scan()[0]

    def read_manifest(self, name: str) -> CheckpointManifest:
        step_of(name)
        try:
            raw = self.store.get_bytes(self._key(name, MANIFEST_NAME))
        except ObjectNotFound as exc:
            raise ObjectNotFound(
                f"checkpoint {name} in {self.store.uri} has no {MANIFEST_NAME}: it does not exist or its "
                f"save did not finish"
            ) from exc
        return CheckpointManifest.from_json(name, raw, prefix=self.prefix)

    def _checked_bytes(self, manifest: CheckpointManifest, file: str, progress: Progress | None = None) -> bytes:
        entry = manifest.files[file]
        try:
            data = self.store.get_bytes(manifest.key(file), progress=progress)
        except ObjectNotFound as exc:
            raise CheckpointCorrupt(f"checkpoint {manifest.name}: file {file!r} is missing") from exc
        if len(data) != entry.size:
            raise CheckpointCorrupt(
                f"checkpoint {manifest.name}: file {file!r} has {len(data)} bytes, the manifest says "
                f"{entry.size} (truncated or replaced)"
            )
        actual = hashlib.sha256(data).hexdigest()
        if actual != entry.sha256:
            raise CheckpointCorrupt(
                f"checkpoint {manifest.name}: file {file!r} has sha256 {actual[:12]}…, the manifest says "
                f"{entry.sha256[:12]}… (modified after the save)"
            )
        return data

    def load(self, name: str, progress: Progress | None = None) -> LoadedCheckpoint:
        manifest = self.read_manifest(name)
        return LoadedCheckpoint(manifest, {f: self._checked_bytes(manifest, f, progress) for f in manifest.files})

    def verify(self, name: str) -> CheckpointManifest:
        """Check every file against the manifest, holding one file at a time."""
        manifest = self.read_manifest(name)
        for file in manifest.files:
            self._checked_bytes(manifest, file)
        return manifest

    def latest_valid(self, progress: Progress | None = None, decode: Callable[[LoadedCheckpoint], Any] = None,
                     skipped: list[SkippedCheckpoint] | None = None, before_step: int | None = None) -> Any:
        """The newest complete checkpoint whose files verify (and that `decode` accepts: what it returns), of
        those before step `before_step` when given (older_than); None if there is none.

        A corrupt one is skipped loudly (warning, and in `skipped`), because resuming silently from an older
        step would otherwise look like lost training progress with no explanation.
        """
        complete, incomplete = self._scan()
        newest_complete = step_of(complete[0]) if complete else -1
        for name in incomplete:
            if step_of(name) > newest_complete:
                log.info("ignoring checkpoint %s in %s: no %s, its save did not finish",
                         name, self.store.uri, MANIFEST_NAME)
        return first_loadable(older_than(complete, before_step), lambda name: self.load(name, progress),
                              self.store.uri, decode, skipped)


def older_than(names: list[str], before_step: int | None) -> list[str]:
    """Of checkpoint `names` (newest first), those taken before step `before_step` (all when None): a retry
    after a NaN/Inf at that step resumes from a state the NaN never touched (JobConfig.resume_before_step)."""
    return list(names) if before_step is None else [n for n in names if step_of(n) < before_step]


def first_loadable(names, load: Callable[[str], LoadedCheckpoint], where: str,
                   decode: Callable[[LoadedCheckpoint], Any] | None = None,
                   skipped: list[SkippedCheckpoint] | None = None) -> Any:
    """The first of `names` (newest first) that `load` reads and verifies and `decode` accepts (its result;
    the LoadedCheckpoint without one). A corrupt one (CheckpointCorrupt, which an unsafe state.pt is too,
    raised by `decode`) is skipped loudly, and appended to `skipped`."""
    for name in names:
        try:
            loaded = load(name)
            return decode(loaded) if decode is not None else loaded
        except (CheckpointCorrupt, ObjectNotFound) as exc:
            message = f"skipping checkpoint {name} in {where}: {exc}"
            log.warning(message)
            warnings.warn(message, CheckpointWarning, stacklevel=2)
            if skipped is not None:
                skipped.append(SkippedCheckpoint(name, str(exc)))
    return None


def _entry_of_bytes(data: bytes) -> FileEntry:
    return FileEntry(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def _entry_of_file(path: str) -> FileEntry:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return FileEntry(sha256=digest.hexdigest(), size=os.path.getsize(path))
