"""The training loop's last sign of progress: which step completed last, and when.

The loop writes it after every completed step; the stall watchdog (every rank) and the heartbeat writer
(rank 0) read it from their threads. Both therefore judge one quantity, the time since the last completed
step (or since the attempt started, before its first step), which is what `verdict.stalled` decides on.
"""
from __future__ import annotations

import time


class Progress:
    def __init__(self, step: int | None = None):
        self.beat(step)

    def beat(self, step: int | None) -> None:
        # One tuple, replaced whole: a reading thread never sees a step with another step's time.
        self._last = (step, time.monotonic(), time.time())

    def read(self) -> tuple[int | None, float, float]:
        """(last step, seconds since it on the monotonic clock, its wall-clock time), all of one beat."""
        step, mono, wall = self._last
        return step, time.monotonic() - mono, wall
