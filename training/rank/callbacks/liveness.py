"""Liveness: the stall watchdog (every rank) and rank 0's heartbeat, both judging one Progress.

Started before anything that can hang: by the worker before the engine's rendezvous when the launcher's
environment names the rank (worker_env.launcher_rank), else by the Trainer once the engine knows it; then
reading the data and the checkpoint from a store, the first collectives with a dead peer. Stopped after
result.json is written. Start-up code marks its phases and what they did on `progress`; on the loop it marks
progress once when training is ready to start, then after every completed step.
"""
from __future__ import annotations

from typing import Callable

from .base import Callback
from ...formats.config import HealthConfig
from ...health.heartbeat import ATTEMPT_LINE, ENDED, HeartbeatWriter
from ...health.progress import FIRST_STEP, Progress
from ...health.verdict import Verdict
from ..watchdog import StallWatchdog
from ...store.base import ObjectStore


class Liveness(Callback):
    def __init__(self, attempt: str, cfg: HealthConfig, rank: int, on_stall: Callable[[Verdict], None]):
        """on_stall: called from the watchdog's thread with a STALLED or STORE_UNAVAILABLE verdict; it must
        end the process. Whoever can say most about the attempt replaces it (`on_stall = ...`)."""
        self.progress = Progress()
        self.rank, self.attempt, self.cfg = rank, attempt, cfg
        self.on_stall = on_stall
        self.watchdog = StallWatchdog(self.progress, cfg.stall_seconds, cfg.store_timeout_seconds, rank,
                                      lambda verdict: self.on_stall(verdict))
        self.heartbeat: HeartbeatWriter | None = None
        if rank == 0:
            # The watcher outside the job learns from the log which attempt it watches.
            print(ATTEMPT_LINE.format(attempt=attempt), flush=True)

    def start(self) -> None:
        """From here on, no progress for stall_seconds is a stall."""
        if not self.watchdog.is_alive() and self.watchdog.ident is None:
            self.watchdog.start()

    def start_heartbeat(self, store: ObjectStore, before_write: Callable[[], None] = lambda: None) -> None:
        """Rank 0: beat into `store` (its attempt's own, once it has claimed the run folder: fence_guard.py),
        calling `before_write` (the fence check) before each beat."""
        if self.rank == 0 and self.heartbeat is None:
            self.heartbeat = HeartbeatWriter(store, self.attempt, self.progress, self.cfg.heartbeat_interval(),
                                             self.cfg.stall_seconds, before_write)
            self.heartbeat.start()

    def stop(self) -> None:
        self.watchdog.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop(ENDED)

    def on_train_start(self, loop) -> None:
        self.progress.phase(FIRST_STEP)  # resume and first collectives done: the first step is next

    def on_step_end(self, loop, timing) -> None:
        self.progress.beat(timing.step)
