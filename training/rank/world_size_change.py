"""A resume on another number of workers, or with another per-worker batch: how many backward passes make a
step now, and how much the learning rate scales. Pure: decided from numbers the checkpoint and the config
hold, the same on every rank.

The per-worker micro-batch is the config's batch_size (it is what fits a worker's memory, and what the
model was tuned with; the OOM remedy halves it, training/core/remediation.py). The global batch of a step is
world_size x accumulation_steps x batch_size; the run's original one is the first try's (`base_world_size` x
its accumulation x its batch). When the world size or the batch differs from the checkpoint's, the
accumulation is chosen so the new global batch is as close as possible to the original (ties: the larger),
and the learning rate is scaled linearly by the ratio of the new global batch to the checkpoint's (Goyal et
al.'s linear scaling rule, the one the first try already applied to its world size). The data cursor needs
nothing: a settled cursor names rows, not micro-batches (stream_deal.py).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class WorldSizeChange:
    """From the checkpoint's world size and accumulation to this try's."""

    from_world_size: int
    to_world_size: int
    from_accumulation_steps: int
    accumulation_steps: int
    base_world_size: int       # the first try's: the original global batch is its
    base_accumulation_steps: int
    batch_size: int            # per worker, per micro-batch: this try's
    from_batch_size: int | None = None  # the checkpoint's (None: batch_size)
    base_batch_size: int | None = None  # the first try's (None: batch_size)

    def __post_init__(self) -> None:
        for name in ("from_batch_size", "base_batch_size"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.batch_size)

    @property
    def global_batch(self) -> int:
        return self.to_world_size * self.accumulation_steps * self.batch_size

    @property
    def base_global_batch(self) -> int:
        return self.base_world_size * self.base_accumulation_steps * self.base_batch_size

    @property
    def from_global_batch(self) -> int:
        return self.from_world_size * self.from_accumulation_steps * self.from_batch_size

    @property
    def lr_factor(self) -> float:
        """The checkpoint's learning rate times this is this try's: new global batch / the checkpoint's."""
        return self.global_batch / self.from_global_batch

    @property
    def changed(self) -> bool:
        return self.from_world_size != self.to_world_size or self.from_batch_size != self.batch_size

    def as_record(self) -> dict:
        return dataclasses.asdict(self) | {"global_batch": self.global_batch,
                                           "base_global_batch": self.base_global_batch,
                                           "lr_factor": self.lr_factor}

    def describe(self) -> str:
        batch = (f", per-worker batch {self.from_batch_size} -> {self.batch_size}"
                 if self.from_batch_size != self.batch_size else "")
        return (f"world size {self.from_world_size} -> {self.to_world_size}{batch}: {self.accumulation_steps} backward "
                f"pass(es) a step (was {self.from_accumulation_steps}), global batch {self.global_batch} "
                f"(original {self.base_global_batch}), learning rate x {self.lr_factor:.4g}")


def accumulation_for(base_world_size: int, base_accumulation_steps: int, world_size: int,
                     base_batch_size: int = 1, batch_size: int = 1) -> int:
    """The accumulation steps that bring world_size workers' global batch (of batch_size micro-batches)
    closest to the original's (base_world_size x base_accumulation_steps x base_batch_size)."""
    if min(base_world_size, base_accumulation_steps, world_size, base_batch_size, batch_size) < 1:
        raise ValueError(f"world sizes, accumulation and batch sizes must be >= 1 (base {base_world_size} x "
                         f"{base_accumulation_steps} x {base_batch_size}, now {world_size} x ? x {batch_size})")
    original, per_pass = base_world_size * base_accumulation_steps * base_batch_size, world_size * batch_size
    low = max(1, original // per_pass)
    # low or low + 1 passes: the one whose global batch is nearer the original, the larger on a tie.
    return min((low + 1, low), key=lambda k: abs(per_pass * k - original))


def plan_change(from_world_size: int, from_accumulation_steps: int, base_world_size: int,
                base_accumulation_steps: int, to_world_size: int, batch_size: int,
                from_batch_size: int | None = None, base_batch_size: int | None = None) -> WorldSizeChange:
    """The change a resume on `to_world_size` workers of `batch_size` micro-batches makes (the batch sizes
    left out: the same as batch_size). Not `changed` (the checkpoint's world size and batch): nothing."""
    from_batch_size = batch_size if from_batch_size is None else from_batch_size
    base_batch_size = batch_size if base_batch_size is None else base_batch_size
    if to_world_size == from_world_size and batch_size == from_batch_size:
        steps = from_accumulation_steps
    else:
        steps = accumulation_for(base_world_size, base_accumulation_steps, to_world_size, base_batch_size, batch_size)
    return WorldSizeChange(from_world_size, to_world_size, from_accumulation_steps, steps, base_world_size,
                           base_accumulation_steps, batch_size, from_batch_size, base_batch_size)
