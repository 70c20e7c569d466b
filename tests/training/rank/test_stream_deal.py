"""The global cursor's pure functions (stream_deal.py): a deal splits what is unseen into equal contiguous runs,
and advancing through deals on any sequence of world sizes trains on every position of an epoch exactly once."""
import pytest

from ringflow.training.rank.stream_deal import (
    advance, cut, deal, length, micro_batches, normalized, run_lengths, whole,
)


@pytest.mark.parametrize("remaining, world_size, runs", [
    (((0, 10),), 2, [((0, 5),), ((5, 10),)]),
    (((0, 10),), 3, [((0, 4),), ((4, 7),), ((7, 10),)]),          # the leftover row to the first rank
    (((0, 10),), 1, [((0, 10),)]),
    (((0, 3), (5, 8)), 2, [((0, 3),), ((5, 8),)]),
    (((0, 3), (5, 8)), 3, [((0, 2),), ((2, 3), (5, 6)),  ((6, 8),)]),  # a run across two ranges
    (((0, 2),), 3, [((0, 1),), ((1, 2),), ()]),                    # fewer rows than ranks: an empty run
    ((), 2, [(), ()]),
])
def test_deal_cuts_equal_contiguous_runs_in_rank_order(remaining, world_size, runs):
    assert deal(remaining, world_size) == runs


@pytest.mark.parametrize("total, world_size, lengths", [
    (10, 2, [5, 5]), (10, 3, [4, 3, 3]), (11, 4, [3, 3, 3, 2]), (2, 3, [1, 1, 0]), (0, 2, [0, 0]),
])
def test_runs_differ_by_one_row_at_most(total, world_size, lengths):
    assert run_lengths(total, world_size) == lengths


@pytest.mark.parametrize("remaining, world_size, batch_size, count", [
    (((0, 64),), 2, 16, 2),   # whole micro-batches
    (((0, 65),), 2, 16, 3),   # runs of 33 and 32: the first needs a third (partial), the second an empty one
    (((0, 30),), 3, 16, 1),
    (((0, 0),), 2, 16, 0),
])
def test_every_rank_takes_as_many_micro_batches_as_the_longest_run(remaining, world_size, batch_size, count):
    assert micro_batches(normalized(remaining), world_size, batch_size) == count


@pytest.mark.parametrize("remaining, world_size, batch_size, taken, left", [
    (((0, 100),), 2, 10, 1, ((10, 50), (60, 100))),
    (((0, 100),), 2, 10, 5, ()),
    (((0, 100),), 3, 10, 3, ((30, 34), (64, 67), (97, 100))),
    (((10, 50), (60, 100)), 3, 5, 2, ((20, 37), (47, 50), (60, 74), (84, 100))),  # runs [10,37) [37,50)+[60,74) [74,100)
])
def test_advance_leaves_each_run_less_what_its_rank_took(remaining, world_size, batch_size, taken, left):
    assert advance(remaining, world_size, batch_size, taken) == left


def test_the_same_world_size_deals_the_rest_of_the_same_runs():
    remaining = whole(1001)
    runs = deal(remaining, 3)
    after = advance(remaining, 3, 16, 7)
    assert deal(after, 3) == [cut(run, 7 * 16, length(run)) for run in runs]


@pytest.mark.parametrize("sizes, steps", [
    ([2, 3, 1], [5, 4]),       # the 2 -> 3 -> 1
    ([3, 2], [1]),
    ([1, 4, 2, 3], [3, 2, 6]),
    ([2, 3, 1], [0, 0]),       # a resume before any step
])
def test_every_position_of_an_epoch_is_taken_exactly_once_across_world_size_changes(sizes, steps):
    rows, batch_size, remaining, taken = 997, 16, whole(997), []
    for world_size, count in zip(sizes, steps + [None]):
        total = micro_batches(remaining, world_size, batch_size)
        count = total if count is None else count
        for run in deal(remaining, world_size):
            taken += [p for start, stop in cut(run, 0, count * batch_size) for p in range(start, stop)]
        remaining = advance(remaining, world_size, batch_size, count)
    assert remaining == ()
    assert sorted(taken) == list(range(rows))


def test_a_backwards_range_is_refused():
    with pytest.raises(ValueError, match=r"\[5, 3\) is not a range"):
        normalized([(5, 3)])
    assert normalized([(0, 2), (2, 4), (4, 4), (6, 7)]) == ((0, 4), (6, 7))
