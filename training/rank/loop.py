"""The training loop: steps, gradient accumulation, the cursor; everything else is a callback on it.

    for each micro-batch from the cursor on (partial_loss: a partial or empty one weighs its rows):
        loss = callbacks.before_backward(loss_fn(model(x), y))      faults
        backward; callbacks.after_backward                            health: first NaN/Inf loss
        every k-th micro-batch (engine.accumulation_steps), and the run's last:
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


def last_step_of(data: PartitionData, cursor: Cursor, step: int, epochs: int, accumulation_steps: int) -> int:
    """The step a run at `step` and `cursor` ends at after `epochs`: each step is `accumulation_steps`
    micro-batches but the last, which takes what is left (a checkpoint, so a cursor, is only ever at a
    step's end)."""
    if cursor.epoch >= epochs:
        return step
    passes = (data.micro_batches(cursor) - cursor.batch
              + (epochs - cursor.epoch - 1) * data.micro_batches(Cursor(cursor.epoch + 1)))
    return step + -(-passes // accumulation_steps)  # the run's last step may hold fewer passes


def partial_loss(loss: torch.Tensor, rows: int, batch_size: int) -> torch.Tensor:
    """The loss of a micro-batch of `rows` < batch_size rows (its mean over them), weighted so each of its rows
    counts as much as a row of a full micro-batch: every sample of an epoch weighs the same in the gradient,
    whichever step it falls in (the end of a run of the deal, stream_deal.py)."""
    return loss * (rows / batch_size)


def empty_loss(output: torch.Tensor) -> torch.Tensor:
    """The loss of a micro-batch of no rows (a rank whose run of the deal is over): a zero computed through
    the forward pass, so every parameter gets a zero gradient and the rank's backward still joins the step's
    all-reduce (DDP decides in forward that a backward syncs; Horovod's hooks fire on backward)."""
    return output.sum() * 0.0


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
        self.epoch = cursor.epoch  # the epoch of the micro-batch being trained on
        self.loss: torch.Tensor | None = None  # the last micro-batch's loss, detached, where it was computed
        self._loss_value: float | None = last_loss
        self.last_step = last_step_of(data, cursor, step, epochs, engine.accumulation_steps)

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
        k, samples, passes, size = engine.accumulation_steps, 0, 0, self.data.batch_size
        for epoch in range(self.cursor.epoch, self.epochs):
            deal = self.cursor if epoch == self.cursor.epoch else Cursor(epoch)
            self.epoch = epoch
            per_epoch = self.data.micro_batches(deal)
            step_started = time.perf_counter()
            run_ends = epoch == self.epochs - 1
            for b, x, y in self.data.batches(self.seed, deal):
                if not model.training:  # a callback may have evaluated the model
                    model.train()
                # The run's last micro-batch ends its step however many passes it holds: the tail of the
                # last epoch is trained on too, every sample once (its passes weigh 1/k each, as always).
                last_pass = run_ends and b == per_epoch - 1
                if last_pass and k > 1 and (passes + 1) % k:
                    engine.end_step_early()
                rows = len(x)
                if rows:
                    loss = loss_fn(model(x), y)
                    for hook in before_backward:
                        loss = hook(self, loss)
                    self.loss, self._loss_value = loss.detach(), None
                    if rows < size:  # the end of a run of the deal: its rows weigh as a full batch's
                        loss = partial_loss(loss, rows, size)
                else:
                    loss = empty_loss(model(x))
                (loss / k if k > 1 else loss).backward()
                for hook in after_backward:
                    hook(self)
                samples += rows
                passes += 1
                if k > 1 and passes % k and not last_pass:
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
                self.cursor = (Cursor(epoch, b + 1, deal.remaining) if b + 1 < per_epoch else Cursor(epoch + 1))
                stop = self._stop(step_end, timing)
                if stop is not None:
                    return stop
                step_started, samples = time.perf_counter(), 0
        return self._stop(train_end)
