"""Fault injection, driven by the job config's `faults` list: tests use it to prove the health checks fire."""
from __future__ import annotations

import os
import signal
import sys
import time

import torch

from .base import Callback
from ...formats.config import JobConfig


class FaultInjection(Callback):
    def __init__(self, cfg: JobConfig, rank: int):
        # The operator passes only this try's faults (FaultConfig.on_try): every one given fires.
        self._faults = [f for f in cfg.faults if f.rank == rank]
        self._batch_size = cfg.batch_size
        self._fired: set[str] = set()

    @property
    def active(self) -> bool:
        """Whether this rank has any fault to inject."""
        return bool(self._faults)

    def _due(self, kind: str, step: int, once: bool = True):
        for f in self._faults:
            if f.kind == kind and step >= f.step and not (once and kind in self._fired):
                self._fired.add(kind)
                return f
        return None

    def before_backward(self, loop, loss: torch.Tensor) -> torch.Tensor:
        step = loop.step + 1
        slow = self._due("slow_rank", step, once=False)
        if slow is not None:
            time.sleep(slow.seconds)
        if self._due("hang", step) is not None:
            print(f"[ringflow] fault: hanging at step {step}", file=sys.stderr, flush=True)
            time.sleep(10**6)
        if self._due("stop", step) is not None:
            print(f"[ringflow] fault: SIGSTOP at step {step} (unix time {time.time():.3f})", file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if self._due("crash", step) is not None:
            _sigkill(f"at step {step}")
        oom = self._due("oom", step)
        if oom is not None and self._batch_size > oom.above_batch:
            # The engine's own error, so the rank ends as a real OOM does (rank_run.run_rank: oom_report).
            print(f"[ringflow] fault: out of memory at step {step} (per-worker batch {self._batch_size} > "
                  f"{oom.above_batch})", file=sys.stderr, flush=True)
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected fault: per-worker batch "
                                         f"{self._batch_size} > {oom.above_batch})")
        if self._due("nan_gradient", step) is not None:
            return loss * float("nan")
        return loss

    def in_commit(self, step: int) -> None:
        """An elastic commit of `step` has copied this rank's state; its collective check comes next."""
        if self._due("crash_in_commit", step) is not None:
            _sigkill(f"in the commit of step {step}")

    def in_upload(self, step: int) -> None:
        """From the checkpoint writer's thread: bytes of the checkpoint of `step` were written, its MANIFEST
        not yet."""
        slow = self._due("slow_upload", step)
        if slow is not None:
            print(f"[ringflow] fault: the upload of the checkpoint of step {step} held {slow.seconds:g}s",
                  file=sys.stderr, flush=True)
            time.sleep(slow.seconds)
        if self._due("crash_in_upload", step) is not None:
            _sigkill(f"in the upload of the checkpoint of step {step}")

    def before_sync(self, loop) -> None:
        # Inside the loop's timed all-reduce wait (loop.py): the step's sync time grows as a slow network's
        # would, on both torch engines, while compute stays the same (no straggler).
        slow = self._due("slow_sync", loop.step + 1, once=False)
        if slow is not None:
            time.sleep(slow.seconds)

    def after_optimizer_step(self, loop, timing) -> None:
        if self._due("perturb_replica", loop.step) is not None:
            with torch.no_grad():
                next(loop.model.parameters()).add_(1e-2)


def _sigkill(when: str) -> None:
    """Kill this process as the kernel or a lost node would: no handler, no flush. The time printed is what a
    recovery is measured from (bench/elastic_recovery.py)."""
    print(f"[ringflow] fault: SIGKILL {when} (unix time {time.time():.3f})", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
