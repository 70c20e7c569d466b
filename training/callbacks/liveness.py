"""Liveness: the stall watchdog (every rank) and rank 0's heartbeat, both judging one Progress.

Started by the worker before anything that can hang (reading the data and the checkpoint from a store,
the first collectives with a dead peer), and stopped after result.json is written; on the loop it only
marks progress: once when training is ready to start, then after every completed step.
"""
from __future__ import annotations

from typing import Callable

from ringflow.training.callbacks.base import Callback
from ringflow.training.config import HealthConfig
from ringflow.training.health.heartbeat import ATTEMPT_LINE, ENDED, HeartbeatWriter
from ringflow.training.health.progress import Progress
from ringflow.training.health.verdict import Verdict
from ringflow.training.health.watchdog import StallWatchdog
from ringflow.training.store.base import ObjectStore


class Liveness(Callback):
    def __init__(self, store: ObjectStore, attempt: str, cfg: HealthConfig, rank: int,
                 on_stall: Callable[[Verdict], None]):
        self.progress = Progress()
        self.watchdog = StallWatchdog(self.progress, cfg.stall_seconds, rank, on_stall)
        self.heartbeat = None
        if rank == 0:
            # The watcher outside the job learns from the log which attempt it watches.
            print(ATTEMPT_LINE.format(attempt=attempt), flush=True)
            self.heartbeat = HeartbeatWriter(store, attempt, self.progress, cfg.heartbeat_interval(),
                                             cfg.stall_seconds)

    def start(self) -> None:
        """From here on, no progress for stall_seconds is a stall."""
        self.watchdog.start()
        if self.heartbeat is not None:
            self.heartbeat.start()

    def stop(self) -> None:
        self.watchdog.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop(ENDED)

    def on_train_start(self, loop) -> None:
        self.progress.beat(loop.step)  # ready to train: resume and first collectives done

    def on_step_end(self, loop, timing) -> None:
        self.progress.beat(timing.step)
