"""Checkpoints on in some blocks of a job's steps and off in others, with the Trainer's own checkpointing
(loop_vs_plain.py, checkpoint_overhead.py): a block with checkpoints on is compared with blocks beside it in
the same job, under the same load, so it shows what checkpoints cost at ringflow's defaults.

A checkpoint due at step t is taken when the block that starts at t has them on: the benchmarks' block timer
closes a block at a step's end before the checkpoint of that step is taken (the Trainer puts checkpointing
last on the loop), so the snapshot and the background upload it starts are counted in the block they
belong to, and with blocks a multiple of checkpoint.every_steps long, a block with checkpoints on holds as
many as the defaults take.
"""
from __future__ import annotations

from typing import Callable

from ringflow.training.formats.config import CheckpointConfig

DEFAULT_INTERVAL = CheckpointConfig().cadence_steps  # steps between due checkpoints at ringflow's defaults
# A checkpoint interval no bench job reaches: checkpoints off (the final checkpoint is written after the timed
# steps, as a peer's script would save its model).
CHECKPOINTS_OFF = {"checkpoint": {"every_steps": 10**6}}


def gate_checkpoints(trainer, on_at: Callable[[int], bool]):
    """Put a gate in place of `trainer.checkpointing` on its loop (before `trainer.train()`): a checkpoint
    due at step t is taken only when `on_at(t)`. The final checkpoint, and the check for a failed write at
    every step, are the Trainer's as always."""
    from ringflow.training.rank.callbacks.base import Callback

    checkpointing = trainer.checkpointing

    class CheckpointGate(Callback):
        def on_step_end(self, loop, timing):
            if checkpointing.due(timing.step) and not on_at(timing.step):
                return None
            return checkpointing.on_step_end(loop, timing)

        def on_train_end(self, loop):
            return checkpointing.on_train_end(loop)

    at = trainer.callbacks.index(checkpointing)
    trainer.callbacks[at] = CheckpointGate()
