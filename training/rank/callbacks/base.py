"""The hooks a training-loop callback may implement (Keras/Ray Train style). Each defaults to doing nothing.

Hooks that return a Verdict are stop decisions: a fatal one (Verdict.is_fatal with the job's
stop_on_degraded) stops the loop at once, before any later callback's hook and before the optimizer
step when it comes from `on_gradients_ready`. The loop calls each hook on the callbacks in list order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ...health.verdict import Verdict

if TYPE_CHECKING:  # torch only for the hints: Liveness (a callback) runs in the torch-free TensorFlow rank too
    import torch

    from ..data import Cursor, PartitionData
    from ..engine import Engine
    from ..step_timing import StepTiming


class Loop(Protocol):
    """The loop that calls the hooks, as every engine's has it: rank/loop.py's TrainingLoop (torch) and
    tensorflow_worker.py's TfTrainer (whose callbacks, Liveness and ProgressLog, read no more). A torch-only
    callback reads the rest of TrainingLoop too (model, optimizer, loss, callbacks). A protocol rather than
    TrainingLoop: loop.py imports this module, so naming loop.py here would close an import cycle."""

    step: int
    epochs: int
    last_loss: float
    cursor: "Cursor"
    data: "PartitionData"
    engine: "Engine"


class Callback:
    def on_train_start(self, loop: "Loop") -> None:
        """Resume and the first collectives are done; the first step comes next."""

    def before_backward(self, loop: "Loop", loss: "torch.Tensor") -> "torch.Tensor":
        """The micro-batch's loss before backward (step = loop.step + 1); may return another loss."""
        return loss

    def after_backward(self, loop: "Loop") -> None:
        """After each micro-batch's backward pass; loop.last_loss is its loss."""

    def before_sync(self, loop: "Loop") -> None:
        """The step's micro-batches are done; the engine's gradient all-reduce wait comes next. The step's sync
        time (StepTiming.sync_time) is measured from before this hook: what it spends counts as all-reduce."""

    def on_gradients_ready(self, loop: "Loop", timing: "StepTiming") -> Verdict | None:
        """The averaged gradients are in .grad and not yet applied: a stop here keeps them out of the model."""
        return None

    def after_optimizer_step(self, loop: "Loop", timing: "StepTiming") -> Verdict | None:
        """The averaged gradients were applied."""
        return None

    def on_step_end(self, loop: "Loop", timing: "StepTiming") -> Verdict | None:
        """The step is complete and loop.cursor points past its data."""
        return None

    def before_checkpoint(self, loop: "Loop", meta: dict, final: bool) -> None:
        """Add to the checkpoint manifest's JSON meta (rank 0, before it is written)."""

    def on_checkpoint(self, loop: "Loop", name: str, final: bool) -> None:
        """Rank 0 wrote checkpoint `name`."""

    def on_train_end(self, loop: "Loop") -> Verdict | None:
        """Every step ran: the last word before the final checkpoint (a fatal verdict means none is written)."""
        return None
