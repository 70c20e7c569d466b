"""The job's samples per second after warm-up, counted as the peers count theirs (bench/peer_worker.py), and
the share of that time rank 0's training thread spent in the health monitor: result.json carries both
(bench/throughput.py compares the first with the peers' and with a plain loop).

The peers' way: every rank times the same steps between two barriers, so a rank's time runs until the
slowest rank is done, and the job's rate is the slowest rank's rate times the number of ranks. A rate taken
from rank 0's own count alone would leave out the time the other ranks still needed after rank 0 stopped
its clock (and rank 0 is the one rank that writes checkpoints), so it is not comparable with theirs.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from .base import Callback
from ..engine import Engine
from ..samples_rate import WARMUP_STEPS, job_samples_per_sec  # noqa: F401 - where tests and bench find them

class Throughput(Callback):
    def __init__(self, engine: Engine, monitor_seconds: Callable[[], float]):
        """monitor_seconds: this rank's training thread's time in the health monitor so far."""
        self._engine, self._monitor_seconds = engine, monitor_seconds
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
            # Every rank reaches this step (the same steps run everywhere): the opening barrier.
            self._barrier("ringflow.throughput.start")
            self._started, self._monitor_at_start = time.perf_counter(), self._monitor_seconds()
        elif self._started is not None:
            self._samples += timing.samples  # this rank's rows (a step's micro-batches are whole minibatches)

    def on_train_end(self, loop) -> None:
        # Every rank ran every step, so every rank decides alike here and the collectives stay matched.
        if self._started is None or not self._samples:
            return
        # The closing barrier: this rank's time runs until every rank is done, as a peer's does.
        self._barrier("ringflow.throughput.end")
        elapsed = time.perf_counter() - self._started
        self.monitor_share = (self._monitor_seconds() - self._monitor_at_start) / elapsed
        local = torch.tensor([[float(self._samples), elapsed]], dtype=torch.float64)
        rows = local if self._engine.size == 1 else self._engine.allgather(local, "ringflow.throughput")
        self.samples_per_sec = job_samples_per_sec(rows[:, 0].tolist(), rows[:, 1].tolist())

    def _barrier(self, name: str) -> None:
        if self._engine.size > 1:
            self._engine.allgather(torch.zeros(1, 1, dtype=torch.float64), name)
