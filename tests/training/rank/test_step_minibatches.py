"""The micro-batches of a step, from where the attempt started and the loop's rule (loop.py): checked against
the loop's own counting, and by table."""
import pytest

from ringflow.training.rank.partition_batches import Cursor
from ringflow.training.rank.step_minibatches import step_minibatches

LEFT = ((40, 100),)  # a settled cursor's unseen stream positions (stream_deal.py)


def loop_steps(first_cursor: Cursor, first_deal: int, per_epoch: int, k: int, epochs: int) -> dict[int, list[Cursor]]:
    """What the training loop does: each step's micro-batches, counted as loop.TrainingLoop.run counts them
    (backward passes from the attempt's start; the first epoch is the first cursor's deal)."""
    steps, current, step, passes = {}, [], 0, 0
    for epoch in range(first_cursor.epoch, epochs):
        first = epoch == first_cursor.epoch
        for b in range(first_cursor.batch if first else 0, first_deal if first else per_epoch):
            current.append(Cursor(epoch, b, first_cursor.remaining if first else None))
            passes += 1
            if k > 1 and passes % k:
                continue
            step += 1
            steps[step], current = current, []
    if current:  # the run's last step: what is left
        steps[step + 1] = current
    return steps


@pytest.mark.parametrize("first_cursor, first_deal, per_epoch, k", [
    (Cursor(0, 0), 5, 5, 1), (Cursor(0, 0), 5, 5, 2), (Cursor(0, 0), 7, 7, 3), (Cursor(1, 3), 7, 7, 3),
    (Cursor(2, 1), 4, 4, 4),
    (Cursor(1, 0, LEFT), 3, 5, 2),  # resumed mid-epoch on a settled cursor: a shorter first deal
    (Cursor(1, 0, LEFT), 4, 9, 3),  # ... on another world size or batch: another count per epoch
])
def test_every_step_is_the_loops(first_cursor, first_deal, per_epoch, k):
    first_step = 11  # the checkpoint's step the attempt resumed from: steps are counted on from it
    for step, cursors in loop_steps(first_cursor, first_deal, per_epoch, k, epochs=5).items():
        assert step_minibatches(first_step + step, first_step, first_cursor, first_deal, per_epoch, k, 5) == cursors, step


# (step, first step, first cursor, first deal's micro-batches, micro-batches per epoch, accumulation, epochs)
# -> cursors
ROWS = [
    (1, 0, Cursor(0, 0), 5, 5, 1, 9, [Cursor(0, 0)]),
    (6, 0, Cursor(0, 0), 5, 5, 1, 9, [Cursor(1, 0)]),
    (3, 0, Cursor(0, 0), 5, 5, 2, 9, [Cursor(0, 4), Cursor(1, 0)]),  # a step across an epoch's end
    (21, 20, Cursor(4, 0), 5, 5, 1, 9, [Cursor(4, 0)]),  # resumed at step 20
    (22, 20, Cursor(4, 0, LEFT), 3, 5, 2, 9, [Cursor(4, 2, LEFT), Cursor(5, 0)]),  # the rest of a settled deal, on
    (5, 0, Cursor(0, 0), 7, 7, 3, 2, [Cursor(1, 5), Cursor(1, 6)]),  # the run's last step: 2 passes of 3 left
]


@pytest.mark.parametrize("step, first_step, first_cursor, first_deal, per_epoch, k, epochs, cursors", ROWS)
def test_table(step, first_step, first_cursor, first_deal, per_epoch, k, epochs, cursors):
    assert step_minibatches(step, first_step, first_cursor, first_deal, per_epoch, k, epochs) == cursors


def test_a_step_before_the_attempt_or_after_the_run_is_refused():
    with pytest.raises(ValueError, match="not trained by this attempt"):
        step_minibatches(20, 20, Cursor(4, 0), 5, 5, 1, 9)
    with pytest.raises(ValueError, match="past the run's end"):
        step_minibatches(6, 0, Cursor(0, 0), 7, 7, 3, 2)
