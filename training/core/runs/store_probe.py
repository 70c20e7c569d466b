"""The watcher's own measure of the run folder's store: is it slow to take writes, or to answer reads?

When rank 0's heartbeat is late, either the job is silent (a dead or frozen rank 0, a lost host) or the store
does not take the heartbeat's writes. Reads alone cannot tell (a store can stall writes and answer reads),
so the watcher writes a small object of its own (run_layout.WATCHER_PROBE) on a thread, one at a time, and
judges the store by how long that write takes (or has been taking), and by how long its read of the
heartbeat took this poll. liveness.judged_outside decides with what `seen` gives: silence is called only once
a probe write begun after the heartbeat went late has come back.
"""
from __future__ import annotations

import collections
import json
import threading
import time

from ...formats.run_layout import WATCHER_PROBE
from ...health.liveness import StoreSeen
from ...store.base import ObjectStore


# The slow spells kept: enough for a heartbeat's silence (a spell ends at most every poll), bounded.
SLOW_SPELLS_KEPT = 64


class StoreProbe:
    def __init__(self, store: ObjectStore, slow_after: float):
        """slow_after: a write or a poll's reads taking longer than this is the store being slow (the
        heartbeat's interval)."""
        self._store = store
        self._slow_after = slow_after
        self._lock = threading.Lock()
        self._started: float | None = None  # monotonic start of the write in flight
        self._started_at = 0.0              # its start on the wall clock (the heartbeat's clock)
        self._answered_at: float | None = None  # wall-clock start of the last finished write
        self._last_seconds = 0.0            # how long the last finished write took (inf: it failed)
        self._reads = 0.0                   # how long the last poll's read of the heartbeat took
        self._slow_spells: collections.deque[tuple[float, float]] = collections.deque(maxlen=SLOW_SPELLS_KEPT)
        self._written = threading.Event()
        self._seq = 0

    def probe(self, wait: float | None = None) -> None:
        """Start a write of the probe object, unless one is still in flight. wait: seconds to wait for it
        (a one-off look, whose next poll never comes); None: return at once, a later poll sees the answer."""
        with self._lock:
            if self._started is None:
                self._started, self._started_at = time.monotonic(), time.time()
                self._seq += 1
                self._written.clear()
                payload = json.dumps({"seq": self._seq, "time": time.time()}).encode()
                threading.Thread(target=self._write, args=(payload,), name="ringflow-store-probe",
                                 daemon=True).start()
        if wait is not None:
            self._written.wait(wait)

    def _write(self, payload: bytes) -> None:
        try:
            self._store.put_bytes(WATCHER_PROBE, payload)
            failed = False
        except Exception:  # noqa: BLE001 - a store that cannot take the write is the finding
            failed = True
        with self._lock:
            self._last_seconds = float("inf") if failed else time.monotonic() - self._started
            self._started, self._answered_at = None, self._started_at
            if self._last_seconds > self._slow_after:
                self._slow_spells.append((self._started_at, time.time()))
            self._written.set()

    def read_took(self, seconds: float) -> None:
        """How long this poll's read of the heartbeat (one small object) took."""
        with self._lock:
            self._reads = seconds
            if seconds > self._slow_after:
                now = time.time()
                self._slow_spells.append((now - seconds, now))

    def seen(self) -> StoreSeen:
        """How slow the store looks to the watcher now: the longest of the write in flight so far, the last
        write, and this poll's reads (0 for a store that answers at once); when the last write that came
        back began; the spells it was seen slow in."""
        with self._lock:
            in_flight = time.monotonic() - self._started if self._started is not None else 0.0
            return StoreSeen(max(in_flight, self._last_seconds, self._reads), self._answered_at,
                             tuple(self._slow_spells))
