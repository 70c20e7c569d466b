"""Notices, on every rank, when the training thread makes no progress for too long, or waits for a store
that moves nothing.

A thread, not a timer on the loop: the loop itself is what hangs (a rank blocked in all-reduce waiting for
a dead peer). Horovod releases the GIL while it waits, so this thread still runs. It judges the loop's
Progress with liveness.judged_in_job, the rule the watcher outside the job applies to rank 0's heartbeat.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..health.liveness import judged_in_job
from ..health.progress import Progress
from ..health.verdict import Verdict


class StallWatchdog(threading.Thread):
    def __init__(self, progress: Progress, stall_seconds: float, store_timeout_seconds: float, rank: int,
                 on_stall: Callable[[Verdict], None]):
        super().__init__(name="ringflow-stall-watchdog", daemon=True)
        self._progress = progress
        self._stall_seconds, self._store_timeout = stall_seconds, store_timeout_seconds
        self._rank = rank
        self._on_stall = on_stall
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        # A poll a quarter of the limit (at most 1 s) notices a stall within stall_seconds * 1.25.
        poll = min(1.0, self._stall_seconds / 4, self._store_timeout / 4)
        while not self._stopped.wait(poll):
            verdict = judged_in_job(self._progress.read(), self._stall_seconds, self._store_timeout, self._rank)
            if verdict is not None:
                self._on_stall(verdict)
                return
