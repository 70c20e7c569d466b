"""heartbeat.json: rank 0's proof of life, rewritten every health.heartbeat_interval() seconds whatever the
health sampling says, and how a watcher outside the job reads silence from it.

One small object rewritten whole (a store has no append), from a thread, so it costs the run store one
write per interval. It says when the training loop last made progress, not merely that the process runs:
a thread that kept beating while the loop hangs in an all-reduce would otherwise hide the hang.

    {"attempt": "…", "seq": 12, "time": 1700000000.0, "step": 340, "silent_seconds": 0.4,
     "progress_at": 1699999999.6, "state": "running" | "ended"}

`silent_seconds` is the in-job watchdog's own quantity (progress.py, monotonic clock) at the time of the
write; only the lateness of the heartbeat itself is measured against the watcher's clock.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
import time
from typing import NamedTuple

from ringflow.training.health.progress import Progress
from ringflow.training.health.verdict import stall_limit
from ringflow.training.run_layout import HEARTBEAT
from ringflow.training.store.base import ObjectNotFound, ObjectStore

RUNNING, ENDED = "running", "ended"
# A heartbeat this many intervals old is late: the writer is dead, frozen or cannot reach the store, so
# silence is counted on from its last word. One interval of slack absorbs a slow write and the poll.
LATE_AFTER_INTERVALS = 2
# Rank 0 prints this line when an attempt begins, so a watcher learns from the job's own log which
# attempt it is watching (an Airflow retry runs in the same run folder as the attempts before it).
ATTEMPT_LINE = "[ringflow] attempt {attempt}"
_ATTEMPT_RE = re.compile(r"\[ringflow\] attempt ([0-9A-Za-z_.-]+)\s*$")


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    attempt: str
    seq: int
    time: float
    step: int | None
    silent_seconds: float
    progress_at: float
    state: str = RUNNING

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "Heartbeat | None":
        """None for anything that is not a heartbeat (a torn or foreign object counts as no word)."""
        try:
            doc = json.loads(raw)
            return cls(**{f.name: doc[f.name] for f in dataclasses.fields(cls)})
        except (ValueError, TypeError, KeyError):
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


class Silence(NamedTuple):
    seconds: float
    last_step: int | None
    seen_by: str
    limit: float


def silence_seen_outside(heartbeat: Heartbeat | None, now: float, interval: float, stall_seconds: float,
                         watching_since: float) -> Silence | None:
    """How long the watched attempt has made no progress, as seen from outside the job, and the limit for
    verdict.stalled; None once the attempt has ended. Pure.

    While heartbeats arrive on time this is exactly what the in-job watchdog measures, so a healthy step
    (however long between health records) is never called stalled from outside. When they stop
    (a dead or frozen rank 0, a lost host), silence grows from the heartbeat's last word. Before the
    attempt's first heartbeat, silence counts from when the watcher saw the job running. The limit is
    verdict.stall_limit's, as in the job: longer while the attempt is starting (no step yet).
    """
    if heartbeat is None:
        return Silence(now - watching_since, None, "the watcher: no heartbeat from this attempt since it started",
                       stall_limit(stall_seconds, None))
    if heartbeat.state == ENDED:
        return None
    limit = stall_limit(stall_seconds, heartbeat.step)
    late = now - heartbeat.time
    if late <= LATE_AFTER_INTERVALS * interval:
        return Silence(heartbeat.silent_seconds, heartbeat.step, "the heartbeat of rank 0", limit)
    return Silence(heartbeat.silent_seconds + late, heartbeat.step,
                   f"the watcher: no heartbeat for {late:.0f}s (due every {interval:g}s)", limit)


class HeartbeatWriter(threading.Thread):
    """Rank 0's thread that rewrites heartbeat.json every `interval` seconds from `progress`.

    It also writes as soon as the silence passes the stall limit, so a watcher outside sees a hang one
    poll after the in-job watchdog does, not up to an interval later."""

    def __init__(self, store: ObjectStore, attempt: str, progress: Progress, interval: float,
                 stall_seconds: float):
        super().__init__(name="ringflow-heartbeat", daemon=True)
        self._store, self._attempt, self._progress = store, attempt, progress
        self._interval, self._stall_seconds = interval, stall_seconds
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._seq = 0
        self._failures = 0

    def run(self) -> None:
        self.write()
        while not self._stopped.wait(self._next_wait()):
            self.write()

    def _next_wait(self) -> float:
        step, silent, _ = self._progress.read()
        until_stall = stall_limit(self._stall_seconds, step) - silent
        if until_stall > 0:
            # 50 ms past the limit, so the silence written is over it.
            return max(0.01, min(self._interval, until_stall + 0.05))
        return self._interval

    def write(self, state: str = RUNNING) -> None:
        with self._lock:  # the last word (stop) never races a routine write
            step, silent, at = self._progress.read()
            beat = Heartbeat(self._attempt, self._seq, time.time(), step, silent, at, state)
            self._seq += 1
            try:
                self._store.put_bytes(HEARTBEAT, beat.to_json())
            except Exception as exc:  # noqa: BLE001 - a failed write is a missed beat, not a failed job
                self._failures += 1
                if self._failures in (1, 10, 100):
                    print(f"[ringflow] heartbeat write failed ({self._failures}x): {exc!r}", file=sys.stderr,
                          flush=True)

    def stop(self, state: str = ENDED) -> None:
        """Stop beating; the last heartbeat says `state` (ended: the watcher stops counting silence)."""
        self._stopped.set()
        self.join(timeout=5)
        self.write(state)

