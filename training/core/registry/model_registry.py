"""Versioned models in an object store, and the pointer that says which version is in production.

Layout under the registry prefix (default `models`) of a store:

    models/<name>/v<N>/CLAIM.json       created first, exclusively: whoever creates it owns number N
    models/<name>/v<N>/<files>          copied from a training checkpoint, only by the claimer
    models/<name>/v<N>/MODEL.json       written after the files are verified: the version is complete; for a
                                        user script's run its "script" section says how to load the model
                                        (the script, its bundle's sha256 and key, engine, state file)
    models/<name>/production.json       the pointer, replaced whole by compare-and-swap on each change:
        {"version": N, "sha256": {file: sha}, "run_uri": uri, "checkpoint": "ckpt-...",
         "metrics": {...}, "promoted_at": ISO8601, "action": "promote"|"rollback",
         "revision": R, "replaced": version before | null, "previous": where a rollback goes | null,
         "writer": host:pid:token}
    models/<name>/history/<R>.json      every pointer ever written, by revision; never rewritten

Many promoters of one model may run at once (two DAGs share a model; a retried task overlaps the
attempt it replaces), on a local folder or S3. What makes that safe:

- Version numbers are claimed by creating `v<N>/CLAIM.json` if absent (an exclusive create; S3
  `If-None-Match: *`). A loser tries N+1. Only the claimer writes under `v<N>/`, so a copy is never
  overwritten by another promoter, and a clean-up after a failed copy deletes only its own files.
  A claim that never completes (a crash, a refused checkpoint) blocks nobody: its number is skipped
  for good, so a later version never mixes with its leftovers.
- Files, then MODEL.json: a version without MODEL.json is not a version (`versions()` skips it).
- The pointer moves by compare-and-swap: read it with its etag, decide, write it with `If-Match`
  (`If-None-Match: *` for the first one). A lost race re-reads and decides again, so the promotion
  gate is judged against the pointer it actually replaces and no update is lost. Each pointer has a
  revision one above the one it replaced and is kept in `history/`; before replacing revision R a
  writer makes sure `history/R` exists, so a crash between the two writes leaves no gap.

A crash at any point leaves the pointer on a complete version. Readers (serving) follow the pointer
and can check each file against its sha256. No Airflow here: the operators are thin wrappers, this
module is the logic and is tested on its own.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import tempfile
import urllib.parse
from typing import Any, Callable

from ...formats.checkpoint import MANIFEST_NAME as CHECKPOINT_MANIFEST
from ...formats.checkpoint import CheckpointCorrupt, CheckpointManifest
from ...formats.run_folder import RunFolder
from ...formats.script_checkpoint import promoted_script
from ...store.base import ObjectNotFound, ObjectStore, PreconditionFailed, join_key

log = logging.getLogger(__name__)

MODEL_FORMAT = "ringflow.model/v1"
CLAIM_FORMAT = "ringflow.model-claim/v1"
MODEL_FILE = "MODEL.json"
CLAIM_FILE = "CLAIM.json"
POINTER_FILE = "production.json"
HISTORY_FOLDER = "history"
# Names the registry writes into a version folder itself; a checkpoint file may not take them.
RESERVED_FILES = (MODEL_FILE, CLAIM_FILE)
# Every lost compare-and-swap means another writer moved the pointer, so a writer loses at most once
# per concurrent writer; this bound only stops a runaway loop (e.g. a store whose etags never match).
MAX_POINTER_ATTEMPTS = 100
# What a model name may be (a folder under models/); DAG forms use the same pattern for their model_name Param.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_NAME_RE = re.compile(MODEL_NAME_PATTERN)
_VERSION_RE = re.compile(r"^v(\d+)$")
_HISTORY_RE = re.compile(r"^(\d+)\.json$")

# decide(current production pointer or None) -> None to go ahead, or the reason not to, in words.
Decide = Callable[["Pointer | None"], "str | None"]


class RegistryError(ValueError):
    """The registry cannot do what was asked; the message says what to change."""


class ProductionMoved(RegistryError):
    """A rollback found production on another version than the one it was meant to replace."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def _writer_id() -> str:
    # Unique per call: it names who moved the pointer in the history, and makes every pointer's
    # bytes unique, which the S3 store relies on to tell whether a write whose answer was lost landed.
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclasses.dataclass(frozen=True)
class Pointer:
    """The content of production.json (and of each history entry).

    revision: 1 for the first pointer, one more on every change (0: a pointer written before
    revisions existed). replaced: the version in production just before this pointer.
    previous: where a rollback from this pointer goes (for a promotion the same as `replaced`; for a
    rollback the newest version below the target, so repeated rollbacks keep walking back).
    """

    version: int
    sha256: dict[str, str]
    run_uri: str  # the run folder the checkpoint came from
    checkpoint: str
    metrics: dict[str, Any]
    promoted_at: str
    previous: int | None
    action: str = "promote"
    revision: int = 0
    replaced: int | None = None
    writer: str = ""

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
    """What promote() did. `version` holds the checkpoint's files (new, or an existing version with
    the same files); `promoted` says whether production points at it now. When it does not,
    `reason` is what `decide` said about `pointer`, the production pointer that was current then."""

    name: str
    version: int
    new_version: bool  # False: an existing version already held these exact files
    pointer: Pointer | None  # production after this call
    previous: int | None  # the version in production when the decision was made
    promoted: bool = True
    reason: str | None = None


def run_key_in(store_uri: str, run_uri: str) -> str:
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

    def _history_key(self, name: str, revision: int) -> str:
        # Zero-padded so that a listing sorts like revisions.
        return self._model_key(name, HISTORY_FOLDER, f"{revision:09d}.json")

    # -- reading --------------------------------------------------------------------------------

    def _scan(self, name: str) -> tuple[list[int], int]:
        """(complete versions ascending, highest version number seen: claimed, complete or leftovers)."""
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
        return self._read_pointer(name)[0]

    def history(self, name: str) -> list[Pointer]:
        """Every production pointer so far, oldest first: each entry's `replaced` is the version of
        the entry before it and its revision is one more (entries before revisions existed aside)."""
        base = self._model_key(name, HISTORY_FOLDER) + "/"
        entries = []
        for info in self.store.list(base):
            if _HISTORY_RE.match(info.key[len(base):]):
                entries.append(Pointer.from_json(self.store.get_bytes(info.key), f"{self.store.uri}/{info.key}"))
        entries.sort(key=lambda p: p.revision)
        # The newest pointer reaches history just after it is written; a crash in between is
        # repaired by the next writer, and until then the pointer itself is the last entry.
        current = self.production(name)
        if current is not None and (not entries or entries[-1].revision < current.revision):
            entries.append(current)
        return entries

    def _read_pointer(self, name: str) -> tuple[Pointer | None, str | None]:
        key = self._model_key(name, POINTER_FILE)
        try:
            raw, etag = self.store.get_bytes_tagged(key)
        except ObjectNotFound:
            return None, None
        return Pointer.from_json(raw, f"{self.store.uri}/{key}"), etag

    # -- writing --------------------------------------------------------------------------------

    def promote(self, name: str, *, run_uri: str, checkpoint: str, metrics: dict[str, Any],
                source_store: ObjectStore | None = None, decide: Decide | None = None) -> Promotion:
        """Copy checkpoint `checkpoint` of the run folder `run_uri` into a new version and
        point production at it, if `decide(current pointer)` returns None (no `decide`: always).

        `decide` is called with the pointer this promotion would replace, again after every lost
        race, so a gate compares against what production is when it changes, not when it was read.
        A refusal leaves the new version in the registry, complete, with production untouched.

        The normal case is one store for runs and models: files are copied server-side and only read
        once, for the sha256 check against the checkpoint MANIFEST. With `source_store` (runs in
        another store) the files go through this process: downloaded, checked, uploaded.
        Raises CheckpointCorrupt for a tampered checkpoint; the pointer is then untouched.
        """
        same_store = source_store is None
        src = self.store if same_store else source_store
        run_key = run_key_in(src.uri, run_uri)  # inside `src`, else a RegistryError that says so
        # The checkpoint the run folder published (run_folder.py), wherever its attempt wrote it.
        manifest = RunFolder(src.child(run_key)).checkpoints().read_manifest(checkpoint)
        reserved = sorted(set(manifest.files) & set(RESERVED_FILES))
        if reserved:
            raise RegistryError(f"checkpoint {checkpoint} has files named {reserved}, which the registry writes "
                                f"itself into a version folder; save the checkpoint under other names")
        wanted = {f: e.sha256 for f, e in manifest.files.items()}

        def src_key(file: str) -> str:  # the file's key in `src`
            return join_key(run_key, manifest.key(file))

        complete, highest = self._scan(name)
        # Same files (by sha256) as a version we have: a retried or repeated promote. Newest first, and
        # only MODEL.json is read per version (two promoters of one checkpoint at once may each make
        # a version; that costs space, not correctness).
        existing, info = None, None
        for v in reversed(complete):
            candidate = self.model_info(name, v)
            if candidate.get("sha256") == wanted:
                existing, info = v, candidate
                break
        if existing is not None:
            log.info("model %s: checkpoint %s is already version %d; no new version", name, checkpoint, existing)
            version = existing
        else:
            version = self._claim(name, highest + 1, run_uri, checkpoint)
            info = self._fill(name, version, manifest, src, src_key, same_store)
            info.update({
                "source": {"store": src.uri, "run_uri": run_uri, "checkpoint": checkpoint, "step": manifest.step,
                           "keys": {f: src_key(f) for f in sorted(manifest.files)}},
                "checkpoint_meta": manifest.meta, "metrics": metrics,
            })
            script = promoted_script(manifest.meta, manifest.files, run_uri)
            if script is not None:  # a user script's model: what loads it (script_state.promoted_script)
                info["script"] = script
            self._complete(name, version, info)

        refusal: list[str] = []

        def plan(current: Pointer | None) -> Pointer | None:
            refusal.clear()
            if current is not None and current.version == version:
                return None  # already in production: promoting twice is harmless
            reason = decide(current) if decide is not None else None
            if reason is not None:
                refusal.append(reason)
                return None
            return self._pointer_from(info, previous=current.version if current else None)

        before, after = self._move_pointer(name, plan)
        if refusal:
            log.info("model %s: version %d stays out of production: %s", name, version, refusal[0])
            return Promotion(name, version, existing is None, before, before.version if before else None,
                             promoted=False, reason=refusal[0])
        if after is not None:
            log.info("model %s: production is now version %d (revision %d, was %s)", name, version,
                     after.revision, before.version if before else "none")
        return Promotion(name, version, existing is None, after or before, before.version if before else None)

    def rollback(self, name: str, to_version: int | None = None, *, from_version: int | None = None) -> Pointer:
        """Point production at `to_version`, or at the pointer's `previous`. Versions are never deleted.
        The new pointer's `previous` is the newest complete version below the target, so repeated
        rollbacks keep walking back instead of toggling between two versions.

        Rolls back from `from_version` (default: the version in production when this call first reads
        the pointer). If a promotion or another rollback moves production to another version before
        this one lands, it raises RegistryError and changes nothing: a rollback meant for one version
        never silently removes a different one. With an explicit `to_version` and no `from_version`,
        production goes to `to_version` whatever it is by then.
        """
        expected = from_version

        def plan(current: Pointer | None) -> Pointer:
            nonlocal expected
            if current is None:
                raise RegistryError(f"model {name!r} has no production version to roll back from")
            if expected is None and to_version is None:
                expected = current.version
            if expected is not None and current.version != expected:
                raise ProductionMoved(
                    f"model {name!r}: production is version {current.version} (revision {current.revision}, "
                    f"{current.action} at {current.promoted_at}), not version {expected} this rollback was "
                    f"meant to replace; nothing was changed. Read the history and roll back again if still wanted"
                )
            target = to_version
            if target is None:
                if current.previous is None:
                    raise RegistryError(
                        f"model {name!r} version {current.version} has no previous version to roll back to; "
                        f"pass to_version (versions: {self.versions(name)})"
                    )
                target = current.previous
            info = self.model_info(name, target)  # raises RegistryError for an unknown version
            older = [v for v in self.versions(name) if v < target]
            return self._pointer_from(info, previous=older[-1] if older else None, action="rollback")

        before, after = self._move_pointer(name, plan)
        assert after is not None  # plan never declines a rollback; it raises instead
        log.info("model %s: rolled back production from version %s to %d (revision %d)", name,
                 before.version if before else "none", after.version, after.revision)
        return after

    # -- helpers --------------------------------------------------------------------------------

    def _claim(self, name: str, first: int, run_uri: str, checkpoint: str) -> int:
        """Own the lowest free version number >= first: exactly one creator of v<N>/CLAIM.json wins."""
        version = first
        while True:
            doc = {"format": CLAIM_FORMAT, "version": version, "claimed_at": _now(), "writer": _writer_id(),
                   "run_uri": run_uri, "checkpoint": checkpoint}
            try:
                self.store.put_bytes_if_absent(self._version_key(name, version, CLAIM_FILE),
                                               json.dumps(doc, indent=1, sort_keys=True).encode())
            except PreconditionFailed:
                version += 1  # claimed by another promoter (maybe one that crashed): never share it
                continue
            return version

    def _fill(self, name: str, version: int, manifest: CheckpointManifest, src: ObjectStore, src_key,
              same_store: bool) -> dict[str, Any]:
        """Copy and verify the files into our claimed version; the MODEL.json document, less source."""
        try:
            if same_store:
                self._copy_server_side(name, version, manifest, src_key)
            else:
                self._copy_through(name, version, manifest, src, src_key)
        except BaseException as exc:
            self._abandon(name, version, manifest, exc)
            raise
        return {
            "format": MODEL_FORMAT, "name": name, "version": version,
            "files": {f: dataclasses.asdict(e) for f, e in sorted(manifest.files.items())},
            "sha256": {f: e.sha256 for f, e in manifest.files.items()}, "created_at": _now(),
        }

    def _abandon(self, name: str, version: int, manifest: CheckpointManifest, exc: BaseException) -> None:
        # Only this promoter ever wrote under v<N>/ (it owns the claim), and only the checkpoint's own
        # file names: delete exactly those. CLAIM.json stays, so the number is never handed out again.
        for file in manifest.files:
            try:
                self.store.delete(self._version_key(name, version, file))
            except Exception:  # noqa: BLE001 - the copy's error is the one to report
                log.warning("model %s: could not delete %s of abandoned version %d", name, file, version,
                            exc_info=True)
        key = self._version_key(name, version, CLAIM_FILE)
        try:
            raw, etag = self.store.get_bytes_tagged(key)
            doc = json.loads(raw)
            doc.update(state="abandoned", abandoned_at=_now(), error=f"{type(exc).__name__}: {exc}"[:1000])
            self.store.put_bytes_if_match(key, json.dumps(doc, indent=1, sort_keys=True).encode(), etag)
        except Exception:  # noqa: BLE001 - the note is for people; the number is skipped either way
            log.warning("model %s: could not mark version %d abandoned", name, version, exc_info=True)
        log.warning("model %s: version %d abandoned (%s); its number will not be reused", name, version, exc)

    def _complete(self, name: str, version: int, info: dict[str, Any]) -> None:
        # MODEL.json after the files: its presence says the version is complete. Created, not
        # replaced: a second MODEL.json for one number would mean the claim protocol was broken.
        try:
            self.store.put_bytes_if_absent(self._version_key(name, version, MODEL_FILE),
                                           json.dumps(info, indent=1, sort_keys=True).encode())
        except PreconditionFailed as exc:
            raise RegistryError(
                f"model {name!r} version {version} already has a {MODEL_FILE} although this promoter claimed it: "
                f"something wrote into {self._model_key(name, f'v{version}')}/ without claiming it (an older "
                f"ringflow, or by hand); stop it and promote again"
            ) from exc

    def _move_pointer(self, name: str, plan: Callable[[Pointer | None], Pointer | None]
                      ) -> tuple[Pointer | None, Pointer | None]:
        """Compare-and-swap loop on production.json: `plan(current)` returns the pointer to write (its
        revision, `replaced` and `writer` are filled in here) or None to leave production as it is.
        Returns (the pointer the plan last saw, the pointer written or None)."""
        key = self._model_key(name, POINTER_FILE)
        for _ in range(MAX_POINTER_ATTEMPTS):
            current, etag = self._read_pointer(name)
            new = plan(current)
            if new is None:
                return current, None
            if current is not None:
                # Its writer may have crashed before recording it; history must not skip a revision.
                self._record(name, current)
            new = dataclasses.replace(new, revision=(current.revision if current else 0) + 1,
                                      replaced=current.version if current else None, writer=_writer_id())
            data = new.to_json().encode()
            try:
                if etag is None:
                    self.store.put_bytes_if_absent(key, data)
                else:
                    self.store.put_bytes_if_match(key, data, etag)
            except PreconditionFailed:
                log.info("model %s: production changed while deciding (was revision %s); deciding again", name,
                         current.revision if current else "none")
                continue
            self._record(name, new)
            return current, new
        raise RegistryError(
            f"model {name!r}: production.json changed under every one of {MAX_POINTER_ATTEMPTS} attempts to "
            f"replace it; something rewrites it in a loop (or the store's conditional writes do not work)"
        )

    def _record(self, name: str, pointer: Pointer) -> None:
        """Put the pointer into history unless it is there (only one pointer per revision can win the
        swap, so an existing entry is this same one)."""
        try:
            self.store.put_bytes_if_absent(self._history_key(name, pointer.revision), pointer.to_json().encode())
        except PreconditionFailed:
            pass

    def _pointer_from(self, info: dict[str, Any], previous: int | None, action: str = "promote") -> Pointer:
        return Pointer(version=int(info["version"]), sha256=dict(info["sha256"]),
                       run_uri=info["source"]["run_uri"], checkpoint=info["source"]["checkpoint"],
                       metrics=dict(info.get("metrics") or {}), promoted_at=_now(),
                       previous=previous, action=action)

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
