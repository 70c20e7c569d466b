"""The training loop: steps, gradient accumulation, the cursor; everything else is a callback on it.

    for each micro-batch from the cursor on:
        loss = callbacks.before_backward(loss_fn(model(x), y))      faults
        backward; callbacks.after_backward                            health: first NaN/Inf loss
        every k-th micro-batch (engine.accumulation_steps):
            callbacks.before_sync; engine.sync_gradients; step += 1   faults: slow_sync (timed as sync)
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

What the loop does per step beyond forward, backward and the optimizer is what ringflow costs against a
plain loop (bench/throughput.py), so it does little: each hook is called only on the callbacks that
implement it, the step's timing is measured once and handed on typed, and the loss stays a tensor until
someone reads `last_loss` (a float() of a GPU tensor waits for the device).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from .callbacks.base import Callback
from .data import Cursor, PartitionData
from .engine import Engine
from .step_timing import StepTiming
from ..health.verdict import Verdict

HOOKS = ("before_backward", "after_backward", "before_sync", "on_gradients_ready", "after_optimizer_step",
         "on_step_end", "on_train_end")


def last_step_of(epochs: int, batches_per_epoch: int, accumulation_steps: int) -> int:
    """The step a run of `epochs` ends at: each step is `accumulation_steps` minibatches."""
    return epochs * batches_per_epoch // accumulation_steps


def implementing(callbacks: Sequence[Callback], hook: str) -> list[Callable]:
    """The bound `hook` of each callback that overrides Callback's do-nothing default, in list order."""
    default = getattr(Callback, hook)
    return [getattr(c, hook) for c in callbacks if getattr(type(c), hook, default) is not default]


class TrainingLoop:
    def __init__(self, engine: Engine, model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                 data: PartitionData, epochs: int, seed: int, stop_on_degraded: bool,
                 callbacks: Sequence[Callback], step: int = 0, cursor: Cursor = Cursor(),
                 last_loss: float = float("nan")):
        self.engine, self.model, self.loss_fn, self.optimizer = engine, model, loss_fn, optimizer
        self.data, self.epochs, self.seed, self.stop_on_degraded = data, epochs, seed, stop_on_degraded
        self.callbacks = list(callbacks)
        self.step, self.cursor = step, cursor
        self.loss: torch.Tensor | None = None  # the last micro-batch's loss, detached, where it was computed
        self._loss_value: float | None = last_loss
        self.last_step = last_step_of(epochs, data.batches_per_epoch, engine.accumulation_steps)

    @property
    def last_loss(self) -> float:
        """The last micro-batch's loss as a number, taken from `loss` when first asked for."""
        if self._loss_value is None:
            self._loss_value = float(self.loss)
        return self._loss_value

    @property
    def finished(self) -> bool:
        return self.cursor.epoch >= self.epochs

    def _stop(self, hooks: Sequence[Callable], *args) -> Verdict | None:
        """Call each hook in order; the first fatal verdict stops the rest."""
        for hook in hooks:
            verdict = hook(self, *args)
            if verdict is not None and verdict.is_fatal(self.stop_on_degraded):
                return verdict
        return None

    def run(self) -> Verdict | None:
        """Train to the last epoch; the fatal verdict that stopped it, or None when every step ran."""
        for callback in self.callbacks:
            callback.on_train_start(self)
        # Resolved once: the callbacks are fixed from here on.
        before_backward, after_backward, before_sync, gradients_ready, after_step, step_end, train_end = (
            implementing(self.callbacks, hook) for hook in HOOKS)
        model, engine, optimizer, loss_fn = self.model, self.engine, self.optimizer, self.loss_fn
        k, samples, per_epoch = engine.accumulation_steps, 0, self.data.batches_per_epoch
        for epoch in range(self.cursor.epoch, self.epochs):
            start_batch = self.cursor.batch if epoch == self.cursor.epoch else 0
            step_started = time.perf_counter()
            for b, x, y in self.data.batches(self.seed, Cursor(epoch, start_batch)):
                if not model.training:  # a callback may have evaluated the model
                    model.train()
                loss = loss_fn(model(x), y)
                for hook in before_backward:
                    loss = hook(self, loss)
                (loss / k if k > 1 else loss).backward()
                self.loss, self._loss_value = loss.detach(), None
                for hook in after_backward:
                    hook(self)
                samples += len(x)
                if k > 1 and (epoch * per_epoch + b + 1) % k:
                    continue  # accumulate: the engine all-reduces after the k-th backward pass
                sync_started = time.perf_counter()
                for hook in before_sync:
                    hook(self)
                engine.sync_gradients(optimizer)
                synced = time.perf_counter()
                self.step += 1
                timing = StepTiming(self.step, epoch, synced - step_started,
                                    engine.step_sync_seconds(synced - sync_started), samples)
                stop = self._stop(gradients_ready, timing)
                if stop is not None:
                    return stop
                engine.apply_gradients(optimizer)
                optimizer.zero_grad()
                stop = self._stop(after_step, timing)
                if stop is not None:
                    return stop
                self.cursor = Cursor(epoch, b + 1) if b + 1 < per_epoch else Cursor(epoch + 1, 0)
                stop = self._stop(step_end, timing)
                if stop is not None:
                    return stop
                step_started, samples = time.perf_counter(), 0
        return self._stop(train_end)
