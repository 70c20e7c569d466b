"""Python's cyclic garbage collector on a schedule: the same steps on every rank, never a full scan of the
whole process in the middle of training.

Left automatic, Python runs a full collection when enough objects have survived the young generations, at
a moment of its own on each rank, and it scans every object the process holds: with torch, pyarrow and the
job's setup loaded ~340 k of them, ~0.18 s of one core (bench/results/throughput.md). A rank in that
collection holds up every other rank at the next all-reduce, and in a benchmark window it was 6 % of a
small model's training time. So, as torchtitan and Megatron-LM do: a rank collects once before its first
step, freezes everything it holds then (modules, model, data: gc.freeze, never scanned again), turns the
automatic collector off, and collects what training made every `every_steps` steps, at the same step on
every rank. Reference counting still frees at once everything that is not in a cycle.
"""
from __future__ import annotations

import gc

from .base import Callback


class ScheduledGarbageCollection(Callback):
    def __init__(self, every_steps: int):
        if every_steps < 1:
            raise ValueError(f"every_steps is {every_steps}; use >= 1 (0 in the config keeps Python's own collector)")
        self.every_steps = every_steps
        self.collections = 0
        self._was_enabled: bool | None = None  # None: not in charge of the collector

    def on_train_start(self, loop) -> None:
        self._was_enabled = gc.isenabled()
        gc.collect()  # the setup's cycles, before what is left is frozen
        gc.freeze()
        gc.disable()

    def on_step_end(self, loop, timing) -> None:
        if timing.step % self.every_steps == 0:
            gc.collect()  # scans only what was made since the freeze
            self.collections += 1

    def restore(self) -> None:
        """Python's collector as it was before training (the Trainer calls it however training ended)."""
        if self._was_enabled is None:
            return
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None
