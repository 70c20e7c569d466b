"""Watching a run's health from outside the job: the trigger's running verdict on one job.

Torch-free and Airflow-free: the triggerer imports it, and so can a script, given the run folder's store.
`HealthWatch` keeps what a poll learned: which attempt it watches, how far it has read (each sealed segment
once) and the verdict's running state (verdict.HealthJudge), so the cost of a poll does not grow with the run.
Its state is rebuilt by reading once, e.g. after a triggerer restart; bench/watcher_cost.py measures it
against reading and judging everything each poll.
"""
from __future__ import annotations

from typing import Any

import time

from ...formats.config import HealthConfig
from ...health.heartbeat import attempt_in_log, read_heartbeat
from ...health.liveness import LATE_AFTER_INTERVALS, judged_outside
from ...health.records import HealthReader
from ...health.verdict import HealthJudge
from ...health.verdict_line import SaidVerdict
from ...formats.run_folder import RunFolder
from .store_probe import StoreProbe
from ...store.base import ObjectStore


# A one-off look waits this many heartbeat intervals for its probe write: a store held longer is slow.
PROBE_WAIT_INTERVALS = 1.5


class HealthWatch:
    """The watcher's view of one job, whose records share a run folder with earlier attempts of the task.

    It judges only the attempt it watches. It knows which one from `attempt` when the launcher said, else
    from rank 0's ATTEMPT_LINE in the job's log (`learn_from_log`), else from a heartbeat that changes
    while it watches (only a live process writes one, and a live job in this run folder is this one).
    Until then no earlier attempt's record counts, and silence counts from when the job was seen running
    (verdict.stall_limit: STARTUP_SECONDS at least, for its processes to start). A late heartbeat is
    judged with the store's own speed (store_probe.py): a slow store is not a silent job.
    """

    def __init__(self, run: ObjectStore, health: dict[str, Any], attempt: str | None = None,
                 follow_latest: bool = False, one_look: bool = False):
        """run: the run folder's store. follow_latest: watch whichever attempt started last (one look from
        a script, not a retry's watcher, which must not take an earlier attempt's records for its own).
        one_look: polled once (a script's look): a late heartbeat's probe of the store is waited for, as no
        later poll will see its answer."""
        self._store = run
        self.cfg = HealthConfig(**health)
        self.attempt = attempt
        self._from_log = attempt is not None
        self._follow_latest = follow_latest
        self._reader = HealthReader()
        self._judge = HealthJudge(self.cfg)
        self._first_beat: tuple[str, int] | None = None
        self._polled = False
        self._probe = StoreProbe(run, slow_after=self.cfg.heartbeat_interval())
        # Long enough for a held write to count as slow (in flight past the interval), no longer.
        self._probe_wait = PROBE_WAIT_INTERVALS * self.cfg.heartbeat_interval() if one_look else None
        self._folder = RunFolder(run)
        # ((attempt, its latest claim's prefix), where it writes) once it claimed
        self._watched: tuple[tuple[str, str], ObjectStore] | None = None
        self._left_over: list[dict] = []  # the records an earlier claim of the attempt wrote last
        self._first_current: int | None = None  # the pointer's attempt number at the first poll
        # A verdict a rank reached alone (or the launcher, for a rank the kernel killed) printed in the job's log:
        # a rank other than 0 writes no health record, so its log line is the verdict's way out (verdict_line.py).
        self._said = SaidVerdict()
        self.last_step: int | None = None  # the last step rank 0's heartbeat or records showed

    def learn_from_log(self, lines: list[str]) -> None:
        for line in lines:
            found = attempt_in_log(line)
            if found:
                self.attempt, self._from_log = found, True
            self._said.feed(line)

    def poll(self, now: float | None, watching_since: float | None) -> dict | None:
        """The verdict on the watched attempt so far, with `fatal`; None while there is nothing to say.
        `now` (unix seconds, while the job runs) adds the outside stall check on the heartbeat."""
        store = self._attempt_store()
        records = self._reader.poll(store) if store is not None else []
        records, self._left_over = self._left_over + records, []
        if self.attempt is not None and not self._follow_latest:
            records = [r for r in records if r.get("attempt") == self.attempt]  # not even a late write of another
        self._judge.feed(records)
        # The store's speed from one small read, the heartbeat's: reading and judging the records costs what
        # there is to read (all of a run's history in a first poll or a one-off look) and the CPU's load.
        reading_since = time.monotonic()
        heartbeat = read_heartbeat(store) if store is not None else None
        self._probe.read_took(time.monotonic() - reading_since)
        self._adopt(heartbeat)
        steps = [s for s in (heartbeat.step if heartbeat is not None and heartbeat.attempt == self.attempt else None,
                             self._judge.last_step, self.last_step) if s is not None]
        self.last_step = max(steps) if steps else None
        if self._said.verdict is not None:
            return self._dict(self._said.verdict)
        if self._follow_latest and self._judge.started:
            self.attempt = self._judge.attempt
        own = self.attempt is not None and self._judge.started and self._judge.attempt == self.attempt
        verdict = self._judge.verdict() if own else None
        if verdict is not None and verdict.is_fatal(self.cfg.stop_on_degraded):
            return self._dict(verdict)
        beat = heartbeat if heartbeat is not None and heartbeat.attempt == self.attempt else None
        if now is not None and (beat is not None or watching_since is not None) and not (own and self._judge.ended):
            interval = self.cfg.heartbeat_interval()
            since = watching_since if watching_since is not None else now
            if now - (beat.time if beat is not None else since) > LATE_AFTER_INTERVALS * interval:
                self._probe.probe(self._probe_wait)  # late: is it the store? (silence needs its answer)
            stall = judged_outside(beat, now, interval, self.cfg.stall_seconds, self.cfg.store_timeout_seconds,
                                   since, self._probe.seen(), self._store.uri,
                                   records_step=self._judge.last_step if own else None)
            if stall:
                return self._dict(stall)
        return self._dict(verdict) if verdict is not None else None

    def _attempt_store(self) -> ObjectStore | None:
        """Where the watched attempt writes: the folder itself in today's layout; in a fenced one
        (run_folder.py) its own prefix once it has claimed the folder, None before."""
        pointer, _ = self._folder.pointer()
        if pointer is None:
            return self._store
        current = pointer.attempt
        if self._first_current is None:
            self._first_current = current.number
        if self.attempt is None and (self._follow_latest or current.number != self._first_current):
            self.attempt = current.id  # claimed while we watch: a live job in this run folder is this one
        if self.attempt is None:
            return None
        # The attempt's latest claim: an elastic job whose rank 0 died claims the folder again under the same
        # attempt id (rank/elastic.py), and writes its records and heartbeat under the new claim's prefix from
        # then on; its old prefix's heartbeat only goes late, and judged on it the recovery would look a stall.
        mine = [ref for ref in pointer.attempts if ref.id == self.attempt]
        if not mine:
            return None
        if self._watched is None or self._watched[0] != (self.attempt, mine[-1].prefix):
            # What its earlier claims wrote that this watch has not read (all of it when it watches the attempt
            # only now), as far as each was visible when the next claim fenced it.
            watched = self._watched[0][1] if self._watched is not None and self._watched[0][0] == self.attempt else None
            prefixes = [ref.prefix for ref in mine]
            for ref in mine[prefixes.index(watched) if watched in prefixes else 0:-1]:
                reader = self._reader if ref.prefix == watched else HealthReader()
                self._left_over += [r for r in reader.poll(self._folder.store.child(ref.prefix))
                                    if ref.last_seq is None or r["seq"] <= ref.last_seq]
            store = self._folder.store.child(mine[-1].prefix)
            self._watched, self._reader = ((self.attempt, mine[-1].prefix), store), HealthReader()
        return self._watched[1]

    def _adopt(self, heartbeat) -> None:
        beat = (heartbeat.attempt, heartbeat.seq) if heartbeat is not None else None
        if not self._polled:
            self._polled, self._first_beat = True, beat
            return
        if beat is not None and beat != self._first_beat and not self._from_log:
            self.attempt = heartbeat.attempt

    def _dict(self, verdict) -> dict:
        return verdict.to_dict() | {"fatal": verdict.is_fatal(self.cfg.stop_on_degraded), "attempt": self.attempt}


def read_verdict(run: ObjectStore, health: dict[str, Any], now: float | None = None,
                 watching_since: float | None = None, attempt: str | None = None) -> dict | None:
    """One look at a run (a script, a test): the verdict on `attempt`, else on the attempt that started
    last, with the heartbeat's stall check when `now` is given. A watcher that polls keeps a HealthWatch."""
    return HealthWatch(run, health, attempt, follow_latest=attempt is None, one_look=True).poll(now, watching_since)
