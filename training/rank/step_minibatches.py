"""Which micro-batches a step trained on: the cursors of step `s`, from where the attempt started.

The loop (loop.py) ends a step after every `accumulation_steps`-th backward pass, counted from the start of
the attempt (a step may run across an epoch's end), and after the run's last one. An attempt starts at a step
boundary (step 0, or a checkpoint's step and its settled cursor), so the start (`first_step`, `first_cursor`)
and the loop's rule give every later step's micro-batches: nothing has to be recorded while training, and a
replay finds the exact micro-batches of a step from the deterministic order alone.

The attempt's first epoch is the deal of `first_cursor.remaining` (stream_deal.py: what of the epoch was
unseen at the checkpoint, dealt to this try's world size), `first_deal_batches` micro-batches long, taken from
`first_cursor.batch` on; every later epoch is a whole epoch's deal, `batches_per_epoch` long. A cursor of the
first epoch carries the first cursor's `remaining`, so the reader deals the same runs the loop trained on.
Pure: table-tested (tests/training/rank/test_step_minibatches.py).
"""
from __future__ import annotations

from .partition_batches import Cursor


def step_minibatches(step: int, first_step: int, first_cursor: Cursor, first_deal_batches: int,
                     batches_per_epoch: int, accumulation_steps: int, epochs: int) -> list[Cursor]:
    """The cursors of the micro-batches step `step` (1-based) trained on, in order, for an attempt that
    started after step `first_step` at `first_cursor` and trains to the end of epoch `epochs` - 1 (the run's
    last step takes what is left). ValueError for a step this attempt did not train."""
    if step <= first_step:
        raise ValueError(f"step {step} was not trained by this attempt, which started after step {first_step}")
    if batches_per_epoch < 1 or accumulation_steps < 1:
        raise ValueError(f"batches_per_epoch {batches_per_epoch} and accumulation_steps {accumulation_steps} "
                         "must be >= 1")
    k = accumulation_steps
    left_in_first = max(first_deal_batches - first_cursor.batch, 0)

    def cursor_of(attempt_pass: int) -> Cursor:
        if attempt_pass < left_in_first:
            return Cursor(first_cursor.epoch, first_cursor.batch + attempt_pass, first_cursor.remaining)
        later = attempt_pass - left_in_first
        return Cursor(first_cursor.epoch + 1 + later // batches_per_epoch, later % batches_per_epoch)

    # Backward passes (attempt_pass) (s - first_step - 1) * k .. (s - first_step) * k - 1 make step s.
    begin = (step - first_step - 1) * k
    cursors = [c for c in (cursor_of(p) for p in range(begin, begin + k)) if c.epoch < epochs]
    if not cursors:
        raise ValueError(f"step {step} is past the run's end (epoch {epochs - 1} ends before it)")
    return cursors
