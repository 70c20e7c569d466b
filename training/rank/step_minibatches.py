"""Which minibatches a step trained on: the cursors of step `s`, from where the attempt started.

The loop (loop.py) numbers a rank's minibatches globally across epochs (epoch * batches_per_epoch + batch)
and ends a step after every `accumulation_steps`-th of them, counted from the start of training. An attempt
starts at a step boundary (step 0, or a checkpoint's step and cursor), so the start (`first_step`,
`first_cursor`) and the loop's rule give every later step's minibatches: nothing has to be recorded while
training, and a replay finds the exact minibatches of a step from the deterministic order alone.
Pure: table-tested (tests/training/rank/test_step_minibatches.py).
"""
from __future__ import annotations

from .partition_batches import Cursor


def step_minibatches(step: int, first_step: int, first_cursor: Cursor, batches_per_epoch: int,
                     accumulation_steps: int) -> list[Cursor]:
    """The cursors of the minibatches step `step` (1-based) trained on, in order, for an attempt that
    started after step `first_step` at `first_cursor`. ValueError for a step this attempt did not train."""
    if step <= first_step:
        raise ValueError(f"step {step} was not trained by this attempt, which started after step {first_step}")
    if batches_per_epoch < 1 or accumulation_steps < 1:
        raise ValueError(f"batches_per_epoch {batches_per_epoch} and accumulation_steps {accumulation_steps} "
                         "must be >= 1")
    k = accumulation_steps
    start = first_cursor.epoch * batches_per_epoch + first_cursor.batch
    # The loop ends a step after global minibatch g when (g + 1) % k == 0: the first step of the attempt
    # ends at the first such g from `start` on, each later one k minibatches after the one before.
    first_end = start + (-(start + 1)) % k
    end = first_end + (step - first_step - 1) * k
    begin = max(start, end - k + 1)
    return [Cursor(g // batches_per_epoch, g % batches_per_epoch) for g in range(begin, end + 1)]
