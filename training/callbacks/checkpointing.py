"""Checkpoint cadence: every checkpoint.every_steps steps, and the final one when every step ran.

Rank 0 writes; the state (model, optimizer, cursor, step, RNG) goes in state.pt (training_state.py), what
a reader needs without torch (model config, schema, world size, the final verdict) in the manifest's meta.
Other callbacks add to the meta (`before_checkpoint`) and learn that it is written (`on_checkpoint`).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ringflow.training.callbacks.base import Callback
from ringflow.training.checkpoint import CheckpointStore, checkpoint_name
from ringflow.training.training_state import STATE_FILE, TrainingState


def serialize_state(loop) -> bytes:
    # The user's module, not an engine's wrapper of it: the same keys whichever engine trained it.
    scaler = loop.engine.precision.scaler
    return TrainingState(model=loop.engine.unwrap(loop.model).state_dict(), optimizer=loop.optimizer.state_dict(),
                         cursor=(loop.cursor.epoch, loop.cursor.batch), step=loop.step,
                         torch_rng=torch.get_rng_state(),
                         grad_scaler=scaler.state_dict() if scaler is not None else None).to_bytes()


class Checkpointing(Callback):
    def __init__(self, checkpoints: CheckpointStore, every_steps: int, rank: int, world_size: int,
                 run_meta: Mapping[str, Any]):
        """run_meta: what every checkpoint of this run says about it (manifest_uri, model, schema)."""
        self._checkpoints, self._every, self._rank, self._size = checkpoints, every_steps, rank, world_size
        self._run_meta = dict(run_meta)
        self.final: str | None = None

    def due(self, step: int) -> bool:
        return step % self._every == 0

    def on_step_end(self, loop, timing) -> None:
        if self.due(timing.step):
            self.save(loop)

    def on_train_end(self, loop) -> None:
        self.final = self.save(loop, final=True)

    def save(self, loop, final: bool = False) -> str:
        """The checkpoint's name, on every rank; rank 0 writes it."""
        if self._rank != 0:
            return checkpoint_name(loop.step)
        meta = {"step": loop.step, "epoch": loop.cursor.epoch, "cursor": [loop.cursor.epoch, loop.cursor.batch],
                "loss": loop.last_loss, "world_size": self._size, "final": final} | self._run_meta
        for callback in loop.callbacks:
            callback.before_checkpoint(loop, meta, final)
        name = self._checkpoints.save(loop.step, {STATE_FILE: serialize_state(loop)}, meta)
        for callback in loop.callbacks:
            callback.on_checkpoint(loop, name, final)
        return name
