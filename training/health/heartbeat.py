"""heartbeat.json: rank 0's proof of life, rewritten every health.heartbeat_interval() seconds whatever the
health sampling says, read by the watcher outside the job (liveness.judged_outside decides).

One small object rewritten whole (a store has no append), from a thread, so it costs the run store one
write per interval. It says when the training thread last made progress, not merely that the process runs:
a thread that kept beating while the loop hangs in an all-reduce would otherwise hide the hang.

    {"attempt": "…", "seq": 12, "time": 1700000000.0, "step": 340, "silent_seconds": 0.4,
     "progress_at": 1699999999.6, "state": "running" | "ended",
     "phase": "training" | "fetch" | …, "done": {"bytes": 123},
     "waiting": {"what": "upload of …", "store_uri": "s3://…", "seconds": 12.0, "idle_seconds": 0.1, …} | null,
     "write_seconds": 0.02}

`silent_seconds`, `phase`, `done` and `waiting` are the in-job reading (progress.py) at the time of the
write; `write_seconds` is how long the previous heartbeat write took, so a watcher that finds the heartbeat
late can tell a store that is slow to take writes from a rank 0 that is silent. Only the lateness of the
heartbeat itself is measured against the watcher's clock.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
import time
from typing import Any, Callable

from .progress import Progress
from .store_ops import StoreOpReading
from .verdict import stall_limit
from ..formats.run_layout import HEARTBEAT
from ..store.base import ObjectNotFound, ObjectStore

RUNNING, ENDED = "running", "ended"
# Rank 0 prints this line when an attempt begins, so a watcher learns from the job's own log which
# attempt it is watching (an Airflow retry runs in the same run folder as the attempts before it).
ATTEMPT_LINE = "[ringflow] attempt {attempt}"
# mpirun's --tag-output prefixes a line with its rank's tag, and Open MPI 4.1 repeats the tag after a line
# that a process flushed on its own ("[1,0]<stdout>:[ringflow] attempt X[1,0]<stdout>:").
_ATTEMPT_RE = re.compile(r"\[ringflow\] attempt ([0-9A-Za-z_.-]+)(?:\[\d+,\d+\]<std(?:out|err)>:)?\s*$")


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    attempt: str
    seq: int
    time: float
    step: int | None
    silent_seconds: float
    progress_at: float
    state: str = RUNNING
    phase: str | None = None            # None in a heartbeat written before phases were recorded
    done: dict[str, int] = dataclasses.field(default_factory=dict)
    waiting: StoreOpReading | None = None
    write_seconds: float = 0.0
    waiting_on_peers: bool = False      # rank 0 blocked in a collective (progress.py)

    def to_json(self) -> bytes:
        doc = dataclasses.asdict(self)
        doc["waiting"] = self.waiting.to_dict() if self.waiting is not None else None
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "Heartbeat | None":
        """None for anything that is not a heartbeat (a torn or foreign object counts as no word)."""
        try:
            doc = json.loads(raw)
            fields: dict[str, Any] = {f.name: doc[f.name] for f in dataclasses.fields(cls)
                                      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
            for optional in ("state", "phase", "done", "write_seconds", "waiting_on_peers"):
                if doc.get(optional) is not None:
                    fields[optional] = doc[optional]
            if doc.get("waiting"):
                fields["waiting"] = StoreOpReading.from_dict(doc["waiting"])
            return cls(**fields)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def read_heartbeat(store: ObjectStore) -> Heartbeat | None:
    try:
        return Heartbeat.from_json(store.get_bytes(HEARTBEAT))
    except ObjectNotFound:
        return None


def attempt_in_log(line: str) -> str | None:
    """The attempt id if `line` is rank 0's ATTEMPT_LINE (as printed, or prefixed by horovodrun/mpirun)."""
    match = _ATTEMPT_RE.search(line)
    return match.group(1) if match else None


class HeartbeatWriter(threading.Thread):
    """Rank 0's thread that rewrites heartbeat.json every `interval` seconds from `progress`.

    It also writes as soon as the silence passes the stall limit, so a watcher outside sees a hang one
    poll after the in-job watchdog does, not up to an interval later."""

    def __init__(self, store: ObjectStore, attempt: str, progress: Progress, interval: float,
                 stall_seconds: float, before_write: Callable[[], None] = lambda: None):
        """before_write: called before each write (the run folder's fence check, fence_guard.py)."""
        super().__init__(name="ringflow-heartbeat", daemon=True)
        self._store, self._attempt, self._progress = store, attempt, progress
        self._before_write = before_write
        self._interval, self._stall_seconds = interval, stall_seconds
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._seq = 0
        self._failures = 0
        self._write_seconds = 0.0

    def run(self) -> None:
        self.write()
        while not self._stopped.wait(self._next_wait()):
            self.write()

    def _next_wait(self) -> float:
        reading = self._progress.read()
        until_stall = stall_limit(self._stall_seconds, reading.step is None) - reading.silent_seconds
        if reading.waiting is None and until_stall > 0:
            # 50 ms past the limit, so the silence written is over it.
            return max(0.01, min(self._interval, until_stall + 0.05))
        return self._interval

    def write(self, state: str = RUNNING) -> None:
        with self._lock:  # the last word (stop) never races a routine write
            reading = self._progress.read()
            beat = Heartbeat(self._attempt, self._seq, time.time(), reading.step, reading.silent_seconds,
                             reading.progress_at, state, reading.phase, reading.done, reading.waiting,
                             self._write_seconds, reading.waiting_on_peers)
            self._seq += 1
            self._before_write()
            started = time.monotonic()
            try:
                self._store.put_bytes(HEARTBEAT, beat.to_json())
            except Exception as exc:  # noqa: BLE001 - a failed write is a missed beat, not a failed job
                self._failures += 1
                if self._failures in (1, 10, 100):
                    print(f"[ringflow] heartbeat write failed ({self._failures}x): {exc!r}", file=sys.stderr,
                          flush=True)
            finally:
                self._write_seconds = time.monotonic() - started

    def stop(self, state: str = ENDED) -> None:
        """Stop beating; the last heartbeat says `state` (ended: the watcher stops counting silence)."""
        self._stopped.set()
        self.join(timeout=5)
        self.write(state)
