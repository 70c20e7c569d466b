"""The minibatches of a step, from where the attempt started and the loop's rule (loop.py): checked against the
loop's own counting, and by table."""
import pytest

from ringflow.training.rank.partition_batches import Cursor
from ringflow.training.rank.step_minibatches import step_minibatches


def loop_steps(first_cursor: Cursor, per_epoch: int, k: int, epochs: int) -> dict[int, list[Cursor]]:
    """What the training loop does: each step's minibatches, counted as loop.TrainingLoop.run counts them."""
    steps, current, step = {}, [], 0
    for epoch in range(first_cursor.epoch, epochs):
        for b in range(first_cursor.batch if epoch == first_cursor.epoch else 0, per_epoch):
            current.append(Cursor(epoch, b))
            if k > 1 and (epoch * per_epoch + b + 1) % k:
                continue
            step += 1
            steps[step], current = current, []
    return steps


@pytest.mark.parametrize("first_cursor, per_epoch, k", [
    (Cursor(0, 0), 5, 1), (Cursor(0, 0), 5, 2), (Cursor(0, 0), 7, 3), (Cursor(1, 3), 7, 3), (Cursor(2, 1), 4, 4),
])
def test_every_step_is_the_loops(first_cursor, per_epoch, k):
    first_step = 11  # the checkpoint's step the attempt resumed from: steps are counted on from it
    for step, cursors in loop_steps(first_cursor, per_epoch, k, epochs=5).items():
        assert step_minibatches(first_step + step, first_step, first_cursor, per_epoch, k) == cursors, step


# (step, first step, first cursor, batches per epoch, accumulation) -> cursors
ROWS = [
    (1, 0, Cursor(0, 0), 5, 1, [Cursor(0, 0)]),
    (6, 0, Cursor(0, 0), 5, 1, [Cursor(1, 0)]),
    (3, 0, Cursor(0, 0), 5, 2, [Cursor(0, 4), Cursor(1, 0)]),  # a step across an epoch's end
    (21, 20, Cursor(4, 0), 5, 1, [Cursor(4, 0)]),  # resumed at step 20
]


@pytest.mark.parametrize("step, first_step, first_cursor, per_epoch, k, cursors", ROWS)
def test_table(step, first_step, first_cursor, per_epoch, k, cursors):
    assert step_minibatches(step, first_step, first_cursor, per_epoch, k) == cursors


def test_a_step_before_the_attempt_is_refused():
    with pytest.raises(ValueError, match="not trained by this attempt"):
        step_minibatches(20, 20, Cursor(4, 0), 5, 1)
