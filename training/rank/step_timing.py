"""One training step's timing, as the loop hands it to its callbacks: every engine's loop makes it (loop.py for
torch, tensorflow_worker.py). Torch-free."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class StepTiming:
    step: int
    epoch: int
    step_time: float  # seconds from the end of the previous step, micro-batches and all-reduce included
    # Of which the gradient all-reduce not hidden behind compute, as the engine measures it
    # (Engine.step_sync_seconds: Horovod waits in sync_gradients, DDP inside backward).
    sync_time: float
    samples: int      # rows this rank trained on in this step
