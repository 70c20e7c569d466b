"""Gradient-sync health on the loop: when to measure, the health log's rhythm, the verdict a final
checkpoint carries. The measuring itself is health/monitor.py; `enabled` switches measuring off and on
between steps (health.enabled; bench/health_overhead.py flips it in alternate blocks of one job).

A NaN/Inf is checked with each measurement, before every checkpoint and at the last step (every step
with health.nonfinite_every_step), always before the optimizer applies the gradient, so a checkpoint never
holds one.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any, Callable

import torch

from .base import Callback
from ...formats.config import HealthConfig
from ..monitor import SyncHealthMonitor, first_nonfinite_on_device, gradient_norm
from ...health.records import HealthLog, record
from ...health.verdict import Verdict


class HealthMonitoring(Callback):
    def __init__(self, monitor: SyncHealthMonitor, log: HealthLog, cfg: HealthConfig, rank: int,
                 checkpoint_due: Callable[[int], bool], start_fields: dict[str, Any] | None):
        """start_fields: what the attempt's `start` record says besides its step (world size, resumed_from,
        the run's thresholds); None: the attempt has started already (an elastic job's later round, which
        its `membership` record opens: rank/elastic.py)."""
        self.monitor, self._log, self._cfg, self._rank = monitor, log, cfg, rank
        self._checkpoint_due, self._start_fields = checkpoint_due, start_fields
        self.enabled = cfg.enabled
        self.seconds_in_monitor = 0.0  # the training thread's time in the monitor (result.json's share)
        self._params: list = []
        self._first_nonfinite_step: int | None = None
        self._first_nonfinite_on_device: torch.Tensor | None = None  # losses on an accelerator

    @property
    def last_verdict(self) -> Verdict | None:
        return self.monitor.last_verdict

    def on_train_start(self, loop) -> None:
        self._params = list(loop.model.parameters())  # made once: gradient_norm may run every step
        if self._rank == 0 and self._start_fields is not None:
            self._log.append(record("start", step=loop.step, **self._start_fields), force_flush=True)

    def after_backward(self, loop) -> None:
        # Local; the next measurement gathers it, so the verdict names the rank and step where it began,
        # not the later step where every replica had caught it.
        if self._first_nonfinite_step is not None:
            return
        if loop.loss.device.type == "cpu":  # free on the host
            if not math.isfinite(loop.last_loss):
                self._first_nonfinite_step = loop.step + 1
        else:  # no wait for the device here: read with the next measurement
            self._first_nonfinite_on_device = first_nonfinite_on_device(self._first_nonfinite_on_device,
                                                                        loop.loss, loop.step + 1)

    def _first_nonfinite(self) -> int | None:
        if self._first_nonfinite_step is None and self._first_nonfinite_on_device is not None:
            first = int(self._first_nonfinite_on_device)
            self._first_nonfinite_step = first if first >= 0 else None
        return self._first_nonfinite_step

    def on_gradients_ready(self, loop, timing) -> Verdict | None:
        step = timing.step
        if not self.enabled or not (self._cfg.nonfinite_every_step or self.monitor.wants_step(step)
                                    or self._checkpoint_due(step) or step == loop.last_step):
            return None
        started = time.perf_counter()
        # The averaged gradient's norm is the same on every rank (under local SGD, the ranks' mean, one
        # small all-reduce), so every rank makes the same choice here and the allgather in on_step stays matched.
        grad_norm = loop.engine.shared_gradient_norm(gradient_norm(self._params))
        verdict = None
        if self.monitor.wants_step(step) or not math.isfinite(grad_norm):
            verdict = self.monitor.on_step(step, timing.epoch, timing.step_time, timing.sync_time, loop.last_loss,
                                           grad_norm, self._first_nonfinite())
        self.seconds_in_monitor += time.perf_counter() - started
        return verdict

    def after_optimizer_step(self, loop, timing) -> Verdict | None:
        if not (self.enabled and self.monitor.wants_checksum(timing.step)):
            return None
        started = time.perf_counter()
        verdict = self.monitor.on_checksum(timing.step, loop.model)
        self.seconds_in_monitor += time.perf_counter() - started
        return verdict

    def before_checkpoint(self, loop, meta: dict, final: bool) -> None:
        if final:
            # A rerun that resumes here has nothing left to measure: it carries this verdict instead.
            verdict = self.monitor.last_verdict
            meta["verdict"] = json.loads(json.dumps(verdict.to_dict(), default=str)) if verdict else None

    def on_checkpoint(self, loop, name: str, final: bool) -> None:
        # The records up to a checkpoint go out with it (the log's own thread writes them now, beside the
        # checkpoint's upload): a crash after both loses neither.
        self._log.flush_soon()

    def on_train_end(self, loop) -> Verdict | None:
        return self.monitor.collect()  # the last measurements, still in flight
