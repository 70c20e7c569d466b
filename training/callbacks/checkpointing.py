"""Checkpoint cadence: every checkpoint.every_steps steps, and the final one when every step ran.

Rank 0 takes a snapshot of the state (model, optimizer, cursor, step, RNG: training_state.py) at the step
and hands it to the background writer (checkpoint_writer.py), so the upload runs while training goes on;
what a reader needs without torch (model config, schema, world size, the final verdict) goes in the
manifest's meta. Other callbacks add to the meta (`before_checkpoint`) and learn that a checkpoint was taken
(`on_checkpoint`). A write that failed stops the loop with its verdict: NONFINITE for a state holding
NaN/Inf (never written), STORE_UNAVAILABLE for a store that kept failing. The final checkpoint is complete
before the loop reports it.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ringflow.training.callbacks.base import Callback
from ringflow.training.checkpoint_writer import AsyncCheckpointWriter, NonFiniteState
from ringflow.training.checkpoint import checkpoint_name
from ringflow.training.health.verdict import NONFINITE, Verdict, store_unavailable
from ringflow.training.store.base import StoreConfigError, StoreUnavailable
from ringflow.training.training_state import TrainingState


def training_state(loop) -> TrainingState:
    """The loop's state now, sharing tensors with the live model and optimizer (host_copy() detaches it)."""
    # The user's module, not an engine's wrapper of it: the same keys whichever engine trained it.
    scaler = loop.engine.precision.scaler
    return TrainingState(model=loop.engine.unwrap(loop.model).state_dict(), optimizer=loop.optimizer.state_dict(),
                         cursor=(loop.cursor.epoch, loop.cursor.batch), step=loop.step,
                         torch_rng=torch.get_rng_state(),
                         grad_scaler=scaler.state_dict() if scaler is not None else None)


def serialize_state(loop) -> bytes:
    return training_state(loop).to_bytes()


class Checkpointing(Callback):
    def __init__(self, writer: AsyncCheckpointWriter | None, every_steps: int, world_size: int,
                 run_meta: Mapping[str, Any], pin_memory: bool = False):
        """writer: rank 0's background writer; None on the other ranks, which write nothing.
        run_meta: what every checkpoint of this run says about it (manifest_uri, model, schema)."""
        self._writer, self._every, self._size = writer, every_steps, world_size
        self._run_meta = dict(run_meta)
        self._pin_memory = pin_memory
        self.final: str | None = None

    @property
    def blocked_seconds(self) -> float:
        return self._writer.blocked_seconds if self._writer is not None else 0.0

    def due(self, step: int) -> bool:
        return step % self._every == 0

    def on_step_end(self, loop, timing) -> Verdict | None:
        if self._writer is None:
            return None
        failure = self._writer.failed()
        if failure is not None:
            return self._verdict(failure)
        if self.due(timing.step):
            return self._save(loop)
        return None

    def on_train_end(self, loop) -> Verdict | None:
        verdict = self._save(loop, final=True)
        if verdict is None and self._writer is not None:
            try:
                self._writer.wait()  # the final checkpoint is complete before anyone reports it
            except Exception as exc:  # noqa: BLE001 - turned into the verdict it means, or raised
                self.final = None
                return self._verdict(exc)
        return verdict

    def _save(self, loop, final: bool = False) -> Verdict | None:
        """Take the checkpoint (rank 0 hands it to the writer); its name on every rank."""
        if self._writer is None:
            if final:
                self.final = checkpoint_name(loop.step)
            return None
        meta = {"step": loop.step, "epoch": loop.cursor.epoch, "cursor": [loop.cursor.epoch, loop.cursor.batch],
                "loss": loop.last_loss, "world_size": self._size, "final": final} | self._run_meta
        for callback in loop.callbacks:
            callback.before_checkpoint(loop, meta, final)
        try:
            writer = self._writer
            name = writer.submit(loop.step, lambda: writer.snapshot(training_state(loop), self._pin_memory), meta,
                                 final)
        except Exception as exc:  # noqa: BLE001 - what the previous write raised
            return self._verdict(exc)
        for callback in loop.callbacks:
            callback.on_checkpoint(loop, name, final)
        if final:
            self.final = name
        return None

    def _verdict(self, failure: BaseException) -> Verdict:
        if isinstance(failure, NonFiniteState):
            return Verdict(NONFINITE,
                           f"{failure}: lower the learning rate, check the input data for NaN/Inf, or clip "
                           "gradients; resume from the last checkpoint (written before)",
                           {"step": failure.step, "tensors": failure.tensors[:20], "seen_by": "the checkpoint writer"})
        if isinstance(failure, (StoreUnavailable, StoreConfigError, OSError)):
            return store_unavailable(self._writer.store_uri, "a checkpoint upload", self._writer.last_write_seconds,
                                     None, "the checkpoint writer of rank 0", error=str(failure))
        raise failure
