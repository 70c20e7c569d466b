"""The hooks a training-loop callback may implement (Keras/Ray Train style). Each defaults to doing nothing.

Hooks that return a Verdict are stop decisions: a fatal one (Verdict.is_fatal with the job's
stop_on_degraded) stops the loop at once, before any later callback's hook and before the optimizer
step when it comes from `on_gradients_ready`. The loop calls each hook on the callbacks in list order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...health.verdict import Verdict

if TYPE_CHECKING:  # torch only for the hints: Liveness (a callback) runs in the torch-free TensorFlow rank too
    import torch

    from ..loop import StepTiming, TrainingLoop


class Callback:
    def on_train_start(self, loop: "TrainingLoop") -> None:
        """Resume and the first collectives are done; the first step comes next."""

    def before_backward(self, loop: "TrainingLoop", loss: "torch.Tensor") -> "torch.Tensor":
        """The micro-batch's loss before backward (step = loop.step + 1); may return another loss."""
        return loss

    def after_backward(self, loop: "TrainingLoop") -> None:
        """After each micro-batch's backward pass; loop.last_loss is its loss."""

    def before_sync(self, loop: "TrainingLoop") -> None:
        """The step's micro-batches are done; the engine's gradient all-reduce wait comes next. The step's sync
        time (StepTiming.sync_time) is measured from before this hook: what it spends counts as all-reduce."""

    def on_gradients_ready(self, loop: "TrainingLoop", timing: "StepTiming") -> Verdict | None:
        """The averaged gradients are in .grad and not yet applied: a stop here keeps them out of the model."""
        return None

    def after_optimizer_step(self, loop: "TrainingLoop", timing: "StepTiming") -> Verdict | None:
        """The averaged gradients were applied."""
        return None

    def on_step_end(self, loop: "TrainingLoop", timing: "StepTiming") -> Verdict | None:
        """The step is complete and loop.cursor points past its data."""
        return None

    def before_checkpoint(self, loop: "TrainingLoop", meta: dict, final: bool) -> None:
        """Add to the checkpoint manifest's JSON meta (rank 0, before it is written)."""

    def on_checkpoint(self, loop: "TrainingLoop", name: str, final: bool) -> None:
        """Rank 0 wrote checkpoint `name`."""

    def on_train_end(self, loop: "TrainingLoop") -> Verdict | None:
        """Every step ran: the last word before the final checkpoint (a fatal verdict means none is written)."""
        return None
