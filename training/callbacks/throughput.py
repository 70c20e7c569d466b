"""Samples per second after warm-up, and the share of that time the training thread spent in the health
monitor: result.json carries both (bench/throughput.py compares them with the peers' and with health off)."""
from __future__ import annotations

import time
from typing import Callable

from ringflow.training.callbacks.base import Callback

WARMUP_STEPS = 10


class Throughput(Callback):
    def __init__(self, world_size: int, accumulation_steps: int, monitor_seconds: Callable[[], float]):
        self._size, self._k, self._monitor_seconds = world_size, accumulation_steps, monitor_seconds
        self._warm_step: int | None = None
        self._started: float | None = None
        self._monitor_at_start = 0.0
        self._samples = 0
        self.samples_per_sec: float | None = None
        self.monitor_share: float | None = None

    def on_train_start(self, loop) -> None:
        self._warm_step = loop.step + WARMUP_STEPS

    def on_step_end(self, loop, timing) -> None:
        if timing.step == self._warm_step:
            self._started, self._monitor_at_start = time.perf_counter(), self._monitor_seconds()
        elif self._started is not None:
            # Every step's rows on every rank (a step's micro-batches are whole minibatches).
            self._samples += timing.samples * self._size

    def on_train_end(self, loop) -> None:
        if self._started is not None and self._samples:
            elapsed = time.perf_counter() - self._started
            self.samples_per_sec = self._samples / elapsed
            self.monitor_share = (self._monitor_seconds() - self._monitor_at_start) / elapsed
