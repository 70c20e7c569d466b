"""The training loop: steps, gradient accumulation, the cursor; everything else is a callback on it.

    for each micro-batch from the cursor on:
        loss = callbacks.before_backward(loss_fn(model(x), y))      faults
        backward; callbacks.after_backward                            health: first NaN/Inf loss
        every k-th micro-batch (engine.accumulation_steps):
            engine.sync_gradients; step += 1
            callbacks.on_gradients_ready  -> stop?                    health: measure (before the update)
            engine.apply_gradients
            callbacks.after_optimizer_step -> stop?                   faults, health: checksum
            cursor past this batch
            callbacks.on_step_end -> stop?                            throughput, health log, liveness,
                                                                      logging, checkpoint cadence
    callbacks.on_train_end -> stop?                                   health: last measurements, then
                                                                      the final checkpoint (listed last)

The engine (engine.py) hides which data-parallel library runs underneath. The loop only runs steps and
reports how it ended (`run()`); the worker turns that into result.json.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import torch

from ringflow.training.callbacks.base import Callback
from ringflow.training.data import Cursor, PartitionData
from ringflow.training.engine import Engine
from ringflow.training.health.verdict import Verdict


@dataclasses.dataclass(frozen=True)
class StepTiming:
    step: int
    epoch: int
    step_time: float  # seconds from the end of the previous step, micro-batches and all-reduce included
    sync_time: float  # of which waiting for the gradient all-reduce
    samples: int      # rows this rank trained on in this step


class TrainingLoop:
    def __init__(self, engine: Engine, model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                 data: PartitionData, epochs: int, seed: int, stop_on_degraded: bool,
                 callbacks: Sequence[Callback], step: int = 0, cursor: Cursor = Cursor(),
                 last_loss: float = float("nan")):
        self.engine, self.model, self.loss_fn, self.optimizer = engine, model, loss_fn, optimizer
        self.data, self.epochs, self.seed, self.stop_on_degraded = data, epochs, seed, stop_on_degraded
        self.callbacks = list(callbacks)
        self.step, self.cursor, self.last_loss = step, cursor, last_loss
        self.last_step = epochs * data.batches_per_epoch // engine.accumulation_steps

    @property
    def finished(self) -> bool:
        return self.cursor.epoch >= self.epochs

    def _stop(self, hook: str, *args) -> Verdict | None:
        """Call `hook` on every callback in order; the first fatal verdict stops the rest."""
        for callback in self.callbacks:
            verdict = getattr(callback, hook)(self, *args)
            if verdict is not None and verdict.is_fatal(self.stop_on_degraded):
                return verdict
        return None

    def run(self) -> Verdict | None:
        """Train to the last epoch; the fatal verdict that stopped it, or None when every step ran."""
        for callback in self.callbacks:
            callback.on_train_start(self)
        k, samples = self.engine.accumulation_steps, 0
        for epoch in range(self.cursor.epoch, self.epochs):
            start_batch = self.cursor.batch if epoch == self.cursor.epoch else 0
            step_started = time.perf_counter()
            for b, x, y in self.data.batches(self.seed, Cursor(epoch, start_batch)):
                self.model.train()
                loss = self.loss_fn(self.model(x), y)
                for callback in self.callbacks:
                    loss = callback.before_backward(self, loss)
                (loss / k).backward()
                self.last_loss = float(loss.detach())
                for callback in self.callbacks:
                    callback.after_backward(self)
                samples += len(x)
                if (epoch * self.data.batches_per_epoch + b + 1) % k:
                    continue  # accumulate: the engine all-reduces after the k-th backward pass
                sync_started = time.perf_counter()
                self.engine.sync_gradients(self.optimizer)
                sync_time = time.perf_counter() - sync_started
                self.step += 1
                timing = StepTiming(self.step, epoch, time.perf_counter() - step_started, sync_time, samples)
                stop = self._stop("on_gradients_ready", timing)
                if stop is not None:
                    return stop
                self.engine.apply_gradients(self.optimizer)
                self.optimizer.zero_grad()
                stop = self._stop("after_optimizer_step", timing)
                if stop is not None:
                    return stop
                self.cursor = Cursor(epoch, b + 1) if b + 1 < self.data.batches_per_epoch else Cursor(epoch + 1, 0)
                stop = self._stop("on_step_end", timing)
                if stop is not None:
                    return stop
                step_started, samples = time.perf_counter(), 0
        return self._stop("on_train_end")
