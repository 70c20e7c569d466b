"""Rank 0's progress lines: what it trains at the start, loss and rate every log_every_steps."""
from __future__ import annotations

import time

from .base import Callback


def say(message: str) -> None:
    print(f"[ringflow] {message}", flush=True)


class ProgressLog(Callback):
    def __init__(self, rank: int, world_size: int, every_steps: int, batch_size: int, learning_rate: float):
        self._rank, self._size, self._every = rank, world_size, every_steps
        self._batch_size, self._lr = batch_size, learning_rate
        self._samples, self._window_start = 0, time.perf_counter()

    def on_train_start(self, loop) -> None:
        self._samples, self._window_start = 0, time.perf_counter()
        if self._rank == 0:
            say(f"training {loop.epochs} epochs x {loop.data.batches_per_epoch} batches of {self._batch_size} "
                f"on {self._size} workers with {loop.engine.name} (lr {self._lr * self._size:g} = {self._lr:g} x {self._size})")

    def on_step_end(self, loop, timing) -> None:
        self._samples += timing.samples
        if timing.step % self._every == 0 and self._rank == 0:
            rate = self._samples * self._size / max(time.perf_counter() - self._window_start, 1e-9)
            say(f"step={timing.step} epoch={timing.epoch + 1}/{loop.epochs} loss={loop.last_loss:.4f} "
                f"samples/s={rate:.0f} sync_share={timing.sync_time / max(timing.step_time, 1e-9):.2f}")
            self._samples, self._window_start = 0, time.perf_counter()
