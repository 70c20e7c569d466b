"""Measures gradient-sync health inside the training loop, on every rank.

Every rank takes part in the same small allgathers, so every rank builds the same records and reaches the
same verdict: all ranks stop together without an extra round of messages. Rank 0 alone writes them.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import torch

from ..formats.config import HealthConfig
from .engine import Engine
from ..health.records import HealthLog, record, step_record
from ..health.replica_schedule import SYNCHRONOUS, ReplicaSchedule
from ..health.verdict import HealthJudge, Verdict


@functools.lru_cache(maxsize=4)
def _position_weights(numel: int, device: torch.device) -> torch.Tensor:
    # On the parameters' device: a GPU rank's parameters times CPU weights would fail.
    return torch.linspace(1.0, 2.0, numel, dtype=torch.float64, device=device)


def parameter_checksum(model: torch.nn.Module) -> float:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    # Position weights catch swapped values, which a plain sum would not.
    return float(torch.dot(flat, _position_weights(flat.numel(), flat.device)))


def gradient_norm(params: Sequence[torch.Tensor]) -> float:
    """Norm of the averaged gradient: the same on every rank, so each rank can act on it alone.

    It can run every step (health.nonfinite_every_step), so it is one fused kernel over a parameter list
    the caller makes once; torch.nn.utils.get_total_norm spends twice as long grouping tensors in Python.
    """
    grads = [p.grad for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))) if grads else 0.0


def first_nonfinite_on_device(first: torch.Tensor | None, loss: torch.Tensor, step: int) -> torch.Tensor:
    """The first step whose loss was not finite, -1 while there is none, kept where `loss` is: on an
    accelerator a float() of the loss would wait for the device every micro-batch, this only queues work
    there, and whoever measures reads it (once per measurement)."""
    if first is None:
        first = torch.full((), -1, dtype=torch.int64, device=loss.device)
    # In place, the step a plain number: no new tensor to hold each micro-batch's answer.
    return first.masked_fill_((first < 0) & ~torch.isfinite(loss.detach()), step)


class SyncHealthMonitor:
    def __init__(self, engine: Engine, cfg: HealthConfig, log: HealthLog, batch_size: int,
                 schedule: ReplicaSchedule = SYNCHRONOUS):
        """schedule: after which steps the replicas agree (local SGD: only at averages), where checksums
        are compared."""
        self._engine = engine
        self._schedule = schedule
        self._cfg = cfg
        self._log = log
        self._batch_size = batch_size
        # Fed each record once: the verdict costs the same at step 1 M as at step 10.
        self._judge = HealthJudge(cfg)
        self._verdict: Verdict | None = None  # the judge's verdict on the records fed so far, once asked
        self._fed = False
        self._pending_step = None  # (handle, meta): the gather of the step meta["step"]
        self._pending_checksum = None  # (handle, step)

    @property
    def last_verdict(self) -> Verdict | None:
        """The verdict on every record so far (None before the first). Judged when asked, not at each
        measurement: the window's straggler and sync-share statistics cost ~70 µs of the training thread,
        and between measurements only a finding that stops the job matters (`_add`)."""
        if self._verdict is None and self._fed:
            self._verdict = self._judge.verdict()
        return self._verdict

    def wants_step(self, step: int) -> bool:
        return step % self._cfg.every_steps == 0

    def wants_checksum(self, step: int) -> bool:
        # Under local SGD the replicas differ between averages by design: compared right after one.
        return self._schedule.due(step, self._cfg.checksum_every_steps)

    def on_step(self, step: int, epoch: int, step_time: float, sync_time: float, loss: float,
                grad_norm: float, first_nonfinite_step: int | None = None) -> Verdict | None:
        """Start gathering this step's measurements; return the verdict on the previous ones if it stops
        the job (None otherwise: `last_verdict` has it).

        Gathers run in the background and are collected one measurement later, so the training loop
        never waits on them: that keeps the monitor's cost to a few percent (bench/throughput.py).
        A non-finite gradient is gathered and judged at once, before the optimizer step.
        """
        if first_nonfinite_step is None and not math.isfinite(loss):
            first_nonfinite_step = step
        first = -1.0 if first_nonfinite_step is None else float(first_nonfinite_step)
        local = torch.tensor([[step_time, sync_time, loss, first]], dtype=torch.float64)
        meta = {"step": step, "epoch": epoch, "grad_norm": grad_norm}
        verdict = self.collect()
        if self._stops(verdict):
            return verdict
        if not math.isfinite(grad_norm):
            rows = self._wait(self._gather(local, "ringflow.health.step.now")).tolist()
            return self._add(step_record(rows, meta, self._batch_size), force=True)
        self._pending_step = (self._gather(local, "ringflow.health.step"), meta)
        return verdict

    def on_checksum(self, step: int, model: torch.nn.Module) -> Verdict | None:
        # Not the step gather on_step started a moment ago for this same step: waiting for it here cost a
        # whole Horovod cycle (~1 ms) at every checksum. It is collected with the next measurement.
        verdict = self.collect(before_step=step)
        if self._stops(verdict):
            return verdict
        local = torch.tensor([[parameter_checksum(model)]], dtype=torch.float64)
        self._pending_checksum = (self._gather(local, "ringflow.health.checksum"), step)
        return verdict

    def _gather(self, local: torch.Tensor, name: str):
        """Start gathering every rank's `local`. A world of one has its rows already: no collective, and
        no library thread woken to run one."""
        return local if self._engine.size == 1 else self._engine.allgather_async(local, name)

    def _wait(self, handle) -> torch.Tensor:
        return handle if self._engine.size == 1 else self._engine.wait(handle)

    def _stops(self, verdict: Verdict | None) -> bool:
        """The loop stops on this verdict (every rank reaches the same one): start no gather after it, or
        a rank that has already stopped and left the job leaves this one's gather failing."""
        return verdict is not None and verdict.is_fatal(self._cfg.stop_on_degraded)

    def collect(self, before_step: int | None = None) -> Verdict | None:
        """Finish the gathers in flight (those started before `before_step`, if given) and judge; the
        verdict if it stops the job, else None."""
        verdict = None
        if self._pending_step is not None and (before_step is None or self._pending_step[1]["step"] < before_step):
            handle, meta = self._pending_step
            self._pending_step = None
            verdict = self._add(step_record(self._wait(handle).tolist(), meta, self._batch_size))
        if self._pending_checksum is not None:
            handle, step = self._pending_checksum
            self._pending_checksum = None
            sums = [r[0] for r in self._wait(handle).tolist()]
            verdict = self._add(record("checksum", step=step, checksums=sums)) or verdict
        return verdict

    def _add(self, rec: dict, force: bool = False) -> Verdict | None:
        """Log and judge one record; the verdict if it stops the job. A fatal finding is the judge's
        first of its kind (cheap to ask); the window's DEGRADED is judged here only when it stops the job."""
        force = force or bool(rec.get("nonfinite_ranks"))
        self._log.append(rec, force_flush=force)
        self._judge.feed([rec])
        self._verdict, self._fed = None, True
        verdict = self._judge.fatal() or (self.last_verdict if self._cfg.stop_on_degraded else None)
        return verdict if self._stops(verdict) else None
