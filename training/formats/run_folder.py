"""A run folder with a fence: each attempt writes under a prefix of its own, and only what the current attempt
published is visible. A stopped attempt whose processes live on (frozen, cut off from the launcher but not
from the store) can write nothing anyone reads.

    run.json                          the pointer: the current attempt and what it published, moved by
                                      compare-and-swap (store.put_bytes_if_match / _if_absent)
    attempts/<number>/                one attempt's own writes: checkpoints/ckpt-<step>/..., health.jsonl,
                                      health/<n>.jsonl, heartbeat.json, result.json
    eval.json, health.png             written by the Airflow tasks after the attempt (run_layout.py)
    remedies.jsonl                    written by the train task between its tries (remediation: "auto")

`RunFolder.open(uri, s3)` is the one way a run folder is opened (the Airflow tasks pass the S3 settings of
their connection, operators/connections.open_run_folder; a training process, None: its environment's), and
the RunFolder is the one way a run is read or written: its result, eval, health records, heartbeat,
checkpoints and health plot. No other module names those keys.

    {"format": "ringflow.run/v1",
     "attempt": {"number": 3, "id": "rf-…-t3", "prefix": "attempts/000003", "first_seq": 180},
     "checkpoints": ["attempts/000003/checkpoints/ckpt-000000100", "attempts/000002/checkpoints/…"],
     "result": "attempts/000003/result.json" | null,
     "history": [{"number": 2, "id": "…", "prefix": "attempts/000002", "first_seq": 90, "last_seq": 179}, …]}

The rules (after a lease: the pointer is the lease, its number the fencing token):
- An attempt starts by `claim`: a compare-and-swap of run.json that makes it the current attempt with a
  number one higher than the pointer's, keeping the published checkpoints, and freezing what the previous
  attempt's health records show at that moment (`last_seq`): records it writes later are never read.
- It writes everything under its own prefix, and publishes a checkpoint or its result by another
  compare-and-swap that succeeds only while the pointer still names it. One that finds another number
  there is fenced (`Fenced`): it stops at once and writes nothing more (verdict FENCED, exit 8).
- Readers (resume, evaluate, promote, `ringflow health`, the trigger) follow the pointer only.
- A run folder without run.json is a new one: nothing is published yet. One that holds the files of an earlier
  ringflow at its top instead (checkpoints/, health.jsonl, result.json: the layout from before run.json, which
  came before the first release) is refused (`RunFolderError`): start a new run (a new run_uri) and retrain.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Mapping

from .eval_result import EvalResult
from .checkpoint import (CheckpointManifest, CheckpointStore, LoadedCheckpoint, SkippedCheckpoint,
                                                 first_loadable, older_than)
from ..health.heartbeat import Heartbeat, read_heartbeat
from ..health.records import HealthReader, last_seq_in
from .run_layout import CHECKPOINTS, EVAL, HEALTH, HEALTH_PLOT, HEALTH_SEGMENTS, REMEDIES, REPLAY_REPORTS, RESULT
from .run_result import RunResult
from ..store import S3Settings, open_store
from ..store.base import ObjectNotFound, ObjectStore, PreconditionFailed, Progress, join_key

POINTER = "run.json"
ATTEMPTS = "attempts"
FORMAT = "ringflow.run/v1"

log = logging.getLogger(__name__)


class Fenced(RuntimeError):
    """This attempt is no longer the current one: a newer attempt claimed the run folder."""

    def __init__(self, mine: int, current: int, current_id: str | None):
        self.mine, self.current, self.current_id = mine, current, current_id
        super().__init__(f"attempt {mine} is fenced: attempt {current} ({current_id}) claimed the run folder "
                         f"since; this attempt stops and writes nothing more")


class RunFolderError(ValueError):
    """run.json is not a pointer this ringflow can read, or the folder is an earlier ringflow's."""


@dataclasses.dataclass(frozen=True)
class AttemptRef:
    number: int
    id: str
    prefix: str
    first_seq: int = 0
    last_seq: int | None = None  # the last health record visible; None: the current attempt's, all of them


@dataclasses.dataclass(frozen=True)
class RunPointer:
    attempt: AttemptRef
    checkpoints: tuple[str, ...] = ()  # checkpoint folders (keys), newest first
    result: str | None = None
    history: tuple[AttemptRef, ...] = ()

    @property
    def attempts(self) -> tuple[AttemptRef, ...]:
        """Every attempt, oldest first: the history, then the current one."""
        return (*self.history, self.attempt)

    def to_json(self) -> bytes:
        doc = {"format": FORMAT, "attempt": dataclasses.asdict(self.attempt), "checkpoints": list(self.checkpoints),
               "result": self.result, "history": [dataclasses.asdict(a) for a in self.history],
               "updated_at": time.time()}
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> "RunPointer":
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise RunFolderError(f"{where} is format {doc.get('format')!r}, not {FORMAT!r}: read it with the "
                                     f"ringflow that wrote it")
            pointer = cls(AttemptRef(**doc["attempt"]), tuple(doc.get("checkpoints") or ()), doc.get("result"),
                          tuple(AttemptRef(**a) for a in doc.get("history") or ()))
        except RunFolderError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RunFolderError(f"{where} is not a ringflow run pointer ({exc!r}); restore it or start a new "
                                 f"run folder") from None
        if any(not ref.prefix for ref in pointer.attempts):  # attempt 0: files taken over from before run.json
            raise RunFolderError(f"{where} names the files of a run folder from before {POINTER} (attempt 0 at its "
                                 f"top): an earlier ringflow wrote it; start a new run (a new run_uri) and retrain")
        return pointer


def attempt_prefix(number: int) -> str:
    return f"{ATTEMPTS}/{number:06d}"


class RunFolder:
    """The run folder at `store`: what the current attempt published, the claim that makes a new one, and
    what the tasks after the attempt write (eval.json, health.png).

    s3: the S3 settings it was opened with (None: the environment's), for the stores the run names (the
    shards its checkpoints were trained on): a run's readers never need a second credential route."""

    def __init__(self, store: ObjectStore, s3: S3Settings | None = None, uri: str | None = None):
        self.store, self.s3 = store, s3
        self._uri = uri

    @classmethod
    def open(cls, uri: str, s3: S3Settings | None = None) -> "RunFolder":
        """The run folder at `uri` (a path, file:// or s3:// URI), an s3:// one with `s3` (None: the S3
        settings of the process's environment, as a training process has them)."""
        return cls(open_store(uri, s3=s3), s3, uri)

    @property
    def uri(self) -> str:
        """The URI it was opened with (what the DAG, the XComs and the links name), else its store's."""
        return self._uri or self.store.uri

    def uri_of(self, key: str) -> str:
        """The URI of `key` in the run folder, for messages and links."""
        return f"{self.uri.rstrip('/')}/{key}"

    def pointer(self) -> tuple[RunPointer | None, str | None]:
        """(run.json, its etag), or (None, None) for a new run folder; RunFolderError for an earlier
        ringflow's (its files at the top, no run.json)."""
        try:
            raw, etag = self.store.get_bytes_tagged(POINTER)
        except ObjectNotFound:
            self._refuse_files_without_pointer()
            return None, None
        return RunPointer.from_json(raw, f"{self.uri.rstrip('/')}/{POINTER}"), etag

    def _refuse_files_without_pointer(self) -> None:
        """RunFolderError if the folder holds what only a run folder from before run.json holds at its top."""
        for info in self.store.list(""):
            if info.key in (RESULT, HEALTH) or info.key.startswith((f"{CHECKPOINTS}/", HEALTH_SEGMENTS)):
                raise RunFolderError(f"{self.uri} holds {info.key} but no {POINTER}: an earlier ringflow wrote it; "
                                     f"start a new run (a new run_uri) and retrain")

    # -- attempts ---------------------------------------------------------------------------------------

    def claim(self, attempt_id: str) -> "Attempt":
        """Make `attempt_id` the current attempt, with a number higher than any before; the previous one is
        fenced from here on, and what its health records show now is all of them that stays visible."""
        while True:
            pointer, etag = self.pointer()
            checkpoints: tuple[str, ...] = ()
            history: tuple[AttemptRef, ...] = ()
            number, first_seq = 1, 0
            if pointer is not None:
                previous, checkpoints = pointer.attempt, pointer.checkpoints
                last = last_seq_in(self.store.child(previous.prefix))
                frozen = dataclasses.replace(previous, last_seq=last if last is not None else previous.first_seq - 1)
                history = (*pointer.history, frozen)
                number = previous.number + 1
                first_seq = frozen.last_seq + 1
            mine = AttemptRef(number, attempt_id, attempt_prefix(number), first_seq)
            claimed = RunPointer(mine, checkpoints, None, history)
            try:
                if etag is None:
                    new_etag = self.store.put_bytes_if_absent(POINTER, claimed.to_json())
                else:
                    new_etag = self.store.put_bytes_if_match(POINTER, claimed.to_json(), etag)
            except PreconditionFailed:
                continue  # another attempt claimed it first: claim after it
            return Attempt(self, mine, new_etag)

    def attempt_store(self, attempt_id: str) -> ObjectStore | None:
        """Where attempt `attempt_id` writes (its latest claim), or None while it has not claimed yet."""
        pointer, _ = self.pointer()
        for ref in reversed(pointer.attempts if pointer is not None else ()):
            if ref.id == attempt_id:
                return self.store.child(ref.prefix)
        return None

    # -- a non-finite step's replay (rank/replay_exchange.py) ---------------------------------------------

    def write_replay_report(self, attempt_id: str, rank: int, raw: bytes) -> bool:
        """Rank `rank`'s replay report, under attempt `attempt_id`'s prefix (any rank writes its own: a file
        per rank, nothing shared, nothing published). False when that attempt is not in run.json (fenced, or
        never claimed): nothing written."""
        store = self.attempt_store(attempt_id)
        if store is None:
            return False
        store.put_bytes(f"{REPLAY_REPORTS}rank-{rank}.json", raw)
        return True

    def read_replay_reports(self, attempt_id: str) -> list[bytes]:
        """Every replay report attempt `attempt_id`'s ranks have written so far."""
        store = self.attempt_store(attempt_id)
        if store is None:
            return []
        out = []
        for info in store.list(REPLAY_REPORTS):
            try:
                out.append(store.get_bytes(info.key))
            except ObjectNotFound:
                continue
        return out

    # -- what was published -----------------------------------------------------------------------------

    def checkpoints(self) -> "PublishedCheckpoints":
        return PublishedCheckpoints(self.store, self.pointer()[0])

    def visible_attempts(self) -> list[tuple[AttemptRef, ObjectStore]]:
        """Each attempt whose health records are read, oldest first, with its store (none before the first)."""
        pointer, _ = self.pointer()
        return [(ref, self.store.child(ref.prefix)) for ref in (pointer.attempts if pointer is not None else ())]

    def current_store(self) -> ObjectStore:
        """Where the current attempt writes (no attempt yet: the folder itself, where none has written)."""
        pointer, _ = self.pointer()
        return self.store.child(pointer.attempt.prefix) if pointer is not None else self.store

    def records_after(self, seq: int) -> list[dict[str, Any]]:
        """The visible health records after `seq`, oldest first: of each attempt, only what lies past `seq`
        is read (each sealed segment at most once), and of a fenced attempt only up to what was visible
        when it was fenced."""
        out: list[dict[str, Any]] = []
        for ref, store in self.visible_attempts():
            if ref.last_seq is not None and ref.last_seq <= seq:
                continue
            reader = HealthReader()
            reader.last_seq = seq
            records = reader.poll(store)
            if ref.last_seq is not None:
                records = [r for r in records if r["seq"] <= ref.last_seq]
            out += records
            if records:
                seq = records[-1]["seq"]
        return out

    def result_key(self) -> str | None:
        """The key of the result the current attempt published; None while it has published none."""
        pointer, _ = self.pointer()
        return None if pointer is None else pointer.result

    # -- what a run's readers read ----------------------------------------------------------------------

    def read_result(self, attempt: str | None = None) -> RunResult | None:
        """The published result (the current attempt's, once it published one), if `attempt` wrote it (any attempt when None); None when there is none. A
        result that cannot be read raises ResultError (a problem to fix, not a missing result)."""
        key = self.result_key()
        if key is None:
            return None
        try:
            raw = self.store.get_bytes(key)
        except ObjectNotFound:
            return None
        result = RunResult.from_json(raw, self.uri_of(key))
        return result if result.is_of(attempt) else None

    def read_health(self) -> list[dict[str, Any]]:
        """All of the run's visible health records in order (records_after: each attempt's, as far as they
        are visible)."""
        return self.records_after(-1)

    def read_heartbeat(self) -> Heartbeat | None:
        """The current attempt's heartbeat (health/heartbeat.py), or None while it has written none."""
        return read_heartbeat(self.current_store())

    # -- what the tasks after an attempt write -----------------------------------------------------------

    @property
    def eval_uri(self) -> str:
        return self.uri_of(EVAL)

    @property
    def health_plot_uri(self) -> str:
        return self.uri_of(HEALTH_PLOT)

    def read_eval(self) -> EvalResult | None:
        """eval.json (the evaluate task's EvalResult); None when the evaluate task has written none;
        EvalResultError, saying to evaluate again, when it is unreadable."""
        try:
            raw = self.store.get_bytes(EVAL)
        except ObjectNotFound:
            return None
        return EvalResult.from_json(raw, self.eval_uri)

    def write_eval(self, result: EvalResult) -> str:
        """Write eval.json; returns its URI."""
        self.store.put_bytes(EVAL, result.to_json())
        return self.eval_uri

    def write_health_plot(self, path: str) -> str:
        """Upload the plot of the health records (an image file at `path`) as health.png; returns its URI."""
        self.store.put_file(HEALTH_PLOT, path)
        return self.health_plot_uri

    def read_remedies(self) -> list[dict[str, Any]]:
        """remedies.jsonl: the remedies the train task planned for its retries, oldest first ([] when none).
        A line that is not JSON raises ValueError naming the file: the retry would run on a guess."""
        try:
            raw = self.store.get_bytes(REMEDIES)
        except ObjectNotFound:
            return []
        try:
            return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        except ValueError as exc:
            raise ValueError(f"{self.uri_of(REMEDIES)} is not JSON lines ({exc}); delete it to retry without "
                             "the remedies of earlier tries") from None

    def append_remedy(self, doc: Mapping[str, Any]) -> str:
        """Add one remedy to remedies.jsonl (rewritten whole: an object store has no append; only the train
        task writes it, between its tries); returns its URI."""
        lines = [json.dumps(d, sort_keys=True) for d in [*self.read_remedies(), dict(doc)]]
        self.store.put_bytes(REMEDIES, ("\n".join(lines) + "\n").encode())
        return self.uri_of(REMEDIES)

    def training_files(self) -> list[str]:
        """The keys of an attempt's files kept beside its metrics (MLflow artifacts): the published result
        and the health plot (those that exist are kept)."""
        key = self.result_key()
        return [*([key] if key else []), HEALTH_PLOT]

    def evaluation_files(self) -> list[str]:
        """The keys of the evaluate task's files kept beside its metrics: eval.json."""
        return [EVAL]

    def read_health_plot(self) -> bytes | None:
        """health.png's bytes (the run page shows them inline); None while the train task has saved none."""
        try:
            return self.store.get_bytes(HEALTH_PLOT)
        except ObjectNotFound:
            return None

    def presigned_health_plot(self, seconds: int) -> str:
        """A time-limited URL of health.png (S3 only), for the task's extra link."""
        return self.store.presigned_get(HEALTH_PLOT, seconds)


class Attempt:
    """The current attempt's handle on the run folder (rank 0 writes through it): its own store, and the
    compare-and-swaps that publish a checkpoint or its result while it is still current."""

    def __init__(self, folder: RunFolder, ref: AttemptRef, etag: str):
        self.folder, self.ref = folder, ref
        self.store = folder.store.child(ref.prefix)
        self._etag = etag
        self._checked = time.monotonic()

    @property
    def number(self) -> int:
        return self.ref.number

    def check(self, max_age: float = 0.0) -> None:
        """Raise Fenced if another attempt claimed the folder (read again when the last read is older)."""
        if time.monotonic() - self._checked < max_age:
            return
        pointer, etag = self.folder.pointer()
        self._checked = time.monotonic()
        if pointer is None or pointer.attempt.number != self.ref.number:
            raise Fenced(self.ref.number, pointer.attempt.number if pointer else -1,
                         pointer.attempt.id if pointer else None)

    def _publish(self, change) -> RunPointer:
        """Apply `change(pointer) -> pointer` by compare-and-swap while this attempt is current."""
        while True:
            pointer, etag = self.folder.pointer()
            if pointer is None or pointer.attempt.number != self.ref.number:
                raise Fenced(self.ref.number, pointer.attempt.number if pointer else -1,
                             pointer.attempt.id if pointer else None)
            updated = change(pointer)
            try:
                self._etag = self.folder.store.put_bytes_if_match(POINTER, updated.to_json(), etag)
            except PreconditionFailed:
                continue  # changed under us: read again (a newer claim fences us on the next read)
            self._checked = time.monotonic()
            return updated

    def publish_checkpoint(self, name: str, keep_last: int | None) -> list[str]:
        """Make checkpoint `name` (written under this attempt's checkpoints/) the newest published one;
        returns the checkpoint folders no longer kept, for the caller to delete."""
        key = join_key(self.ref.prefix, CHECKPOINTS, name)
        dropped: list[str] = []

        def change(pointer: RunPointer) -> RunPointer:
            listed = [key] + [k for k in pointer.checkpoints if k != key]
            kept = listed[:keep_last] if keep_last is not None else listed
            dropped[:] = listed[len(kept):]
            return dataclasses.replace(pointer, checkpoints=tuple(kept))

        self._publish(change)
        return dropped

    def publish_result(self, raw: bytes) -> None:
        """Write the result under this attempt, then point run.json at it."""
        self.check()
        key = join_key(self.ref.prefix, RESULT)
        self.folder.store.put_bytes(key, raw)
        self._publish(lambda pointer: dataclasses.replace(pointer, result=key))


class PublishedCheckpoints:
    """The checkpoints run.json lists, newest first, read like one CheckpointStore (none before the first
    attempt). A name may exist under several attempts; the published one is meant."""

    def __init__(self, store: ObjectStore, pointer: RunPointer | None):
        self.store = store
        self._keys: tuple[str, ...] = pointer.checkpoints if pointer is not None else ()

    def _locate(self, name: str) -> CheckpointStore:
        for key in self._keys:
            prefix, _, found = key.rpartition("/")
            if found == name:
                return CheckpointStore(self.store, prefix=prefix, keep_last=None)
        raise ObjectNotFound(f"checkpoint {name} is not published in {self.store.uri.rstrip('/')}/{POINTER} "
                             f"(published: {[k.rpartition('/')[2] for k in self._keys]})")

    def prefix_of(self, name: str) -> str:
        """The checkpoint's folder prefix in the run folder (e.g. attempts/000003/checkpoints)."""
        return self._locate(name).prefix

    def names(self) -> list[str]:
        return [k.rpartition("/")[2] for k in self._keys]

    def read_manifest(self, name: str) -> CheckpointManifest:
        return self._locate(name).read_manifest(name)

    def load(self, name: str, progress: Progress | None = None) -> LoadedCheckpoint:
        return self._locate(name).load(name, progress)

    def verify(self, name: str) -> CheckpointManifest:
        return self._locate(name).verify(name)

    def latest_valid(self, progress: Progress | None = None, decode=None,
                     skipped: list[SkippedCheckpoint] | None = None, before_step: int | None = None) -> Any:
        """As CheckpointStore.latest_valid: the newest published checkpoint (before step `before_step`, when
        given) that verifies and `decode` accepts."""
        return first_loadable(older_than(self.names(), before_step), lambda name: self.load(name, progress),
                              self.store.uri, decode, skipped)
