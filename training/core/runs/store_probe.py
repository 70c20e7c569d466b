"""The watcher's own measure of the run folder's store: is it slow to take writes, or to answer reads?

When rank 0's heartbeat is late, either the job is silent (a dead or frozen rank 0, a lost host) or the store
does not take the heartbeat's writes. Reads alone cannot tell (a store can stall writes and answer reads),
so the watcher writes a small object of its own (run_layout.WATCHER_PROBE) on a thread, one at a time, and
judges the store by how long that write takes (or has been taking), and by how long its own reads of this
poll took. liveness.judged_outside decides with the number `slow_seconds` gives.
"""
from __future__ import annotations

import json
import threading
import time

from ...formats.run_layout import WATCHER_PROBE
from ...store.base import ObjectStore


class StoreProbe:
    def __init__(self, store: ObjectStore):
        self._store = store
        self._lock = threading.Lock()
        self._started: float | None = None  # monotonic start of the write in flight
        self._last_seconds = 0.0            # how long the last finished write took (inf: it failed)
        self._reads = 0.0                   # how long the reads of the last poll took
        self._seq = 0

    def probe(self) -> None:
        """Start a write of the probe object, unless one is still in flight."""
        with self._lock:
            if self._started is not None:
                return
            self._started = time.monotonic()
            self._seq += 1
            payload = json.dumps({"seq": self._seq, "time": time.time()}).encode()
        threading.Thread(target=self._write, args=(payload,), name="ringflow-store-probe", daemon=True).start()

    def _write(self, payload: bytes) -> None:
        try:
            self._store.put_bytes(WATCHER_PROBE, payload)
            failed = False
        except Exception:  # noqa: BLE001 - a store that cannot take the write is the finding
            failed = True
        with self._lock:
            self._last_seconds = float("inf") if failed else time.monotonic() - self._started
            self._started = None

    def read_took(self, seconds: float) -> None:
        """How long this poll's own reads of the store took."""
        self._reads = seconds

    def slow_seconds(self) -> float:
        """How slow the store looks to the watcher now: the longest of the write in flight so far, the last
        write, and this poll's reads. 0 for a store that answers at once."""
        with self._lock:
            in_flight = time.monotonic() - self._started if self._started is not None else 0.0
            return max(in_flight, self._last_seconds, self._reads)
