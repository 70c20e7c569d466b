"""Rank 0's progress into its TrainJob's status.trainerStatus: every step offers a report, at most one every
MIN_INTERVAL_SECONDS is built and handed to the reporter's thread (rank/trainer_status_reporter.py), and the last
one (100% once every row of the order ran) at the end of training. Only on rank 0 of a TrainJob (TrainerStatusReporter.
from_environ finds one); elsewhere the worker adds no such callback.
"""
from __future__ import annotations

import datetime
import time

from .base import Callback
from ...health.trainer_status import (TrainerStatus, due, metric_values, progress_percentage,
                                      remaining_seconds)


class TrainerStatusReporting(Callback):
    def __init__(self, reporter, world_size: int, clock=time.monotonic):
        self._reporter, self._size, self._clock = reporter, world_size, clock
        self._last: float | None = None
        self._started, self._start_rows, self._samples = 0.0, 0, 0

    @staticmethod
    def _rows(loop) -> tuple[int, int]:
        """(rows of the data order done, all of them): what progress counts (health/trainer_status.py). Rows, not
        micro-batches: a resume on another world size or batch deals the rest in other micro-batches."""
        data = loop.data
        return loop.cursor.epoch * data.epoch_rows + data.rows_seen(loop.cursor), loop.epochs * data.epoch_rows

    def on_train_start(self, loop) -> None:
        self._started, self._start_rows = self._clock(), self._rows(loop)[0]
        self._samples = 0
        self._report(loop, None)

    def on_step_end(self, loop, timing) -> None:
        self._samples += timing.samples
        if due(self._clock(), self._last):
            self._report(loop, timing.epoch)

    def on_train_end(self, loop) -> None:
        self._report(loop, loop.epochs - 1)
        self._reporter.close()
        return None

    def _report(self, loop, epoch: int | None) -> None:
        now = self._clock()
        self._last = now
        done, total = self._rows(loop)
        elapsed = now - self._started
        metrics = {"step": loop.step, "epoch": (epoch if epoch is not None else loop.cursor.epoch) + 1,
                   "workers": self._size}
        if loop.step > 0:
            metrics["loss"] = float(loop.last_loss)
        if elapsed > 0 and self._samples:
            metrics["samples_per_sec"] = self._samples * self._size / elapsed
        self._reporter.submit(TrainerStatus(
            progress_percentage=progress_percentage(done, total),
            estimated_remaining_seconds=remaining_seconds(done, total, done - self._start_rows, elapsed),
            metrics=metric_values(metrics), last_updated=datetime.datetime.now(datetime.timezone.utc)))
