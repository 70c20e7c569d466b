"""Notices when no training step completes for too long.

A thread, not a timer on the loop: the loop itself is what hangs (a rank blocked in all-reduce waiting for
a dead peer). Horovod releases the GIL while it waits, so this thread still runs.
"""
from __future__ import annotations

import threading
import time
from typing import Callable


class StallWatchdog(threading.Thread):
    def __init__(self, stall_seconds: float, on_stall: Callable[[float, int | None], None]):
        super().__init__(name="ringflow-stall-watchdog", daemon=True)
        self._stall_seconds = stall_seconds
        self._on_stall = on_stall
        self._last_beat = time.monotonic()
        self._last_step: int | None = None
        self._stopped = threading.Event()

    def beat(self, step: int) -> None:
        self._last_beat = time.monotonic()
        self._last_step = step

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        poll = min(1.0, self._stall_seconds / 4)
        while not self._stopped.wait(poll):
            silent = time.monotonic() - self._last_beat
            if silent > self._stall_seconds:
                self._on_stall(silent, self._last_step)
                return
