"""Fault injection, driven by the job config's `faults` list. Used by tests to prove the health checks fire."""
from __future__ import annotations

import os
import signal
import sys
import time

import torch

from ringflow.training.config import JobConfig


class FaultInjector:
    def __init__(self, cfg: JobConfig, rank: int):
        self._faults = [f for f in cfg.faults if f.rank == rank]
        self._fired: set[str] = set()

    def _due(self, kind: str, step: int, once: bool = True):
        for f in self._faults:
            if f.kind == kind and step >= f.step and not (once and kind in self._fired):
                self._fired.add(kind)
                return f
        return None

    def before_backward(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        if self._due("slow_rank", step, once=False) is not None:
            time.sleep(self._due("slow_rank", step, once=False).seconds)
        if self._due("hang", step) is not None:
            print(f"[ringflow] fault: hanging at step {step}", file=sys.stderr, flush=True)
            time.sleep(10**6)
        if self._due("crash", step) is not None:
            print(f"[ringflow] fault: SIGKILL at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self._due("nan_gradient", step) is not None:
            return loss * float("nan")
        return loss

    def after_step(self, step: int, model: torch.nn.Module) -> None:
        if self._due("perturb_replica", step) is not None:
            with torch.no_grad():
                next(model.parameters()).add_(1e-2)
