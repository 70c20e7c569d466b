"""How many workers a try launches (min_workers against what the backend can place): a table."""
import pytest

from ringflow.training.core.worker_count import NotEnoughCapacity, workers_to_launch


@pytest.mark.parametrize("num_workers, min_workers, capacity, workers", [
    (4, 4, 4, 4), (4, 2, 9, 4), (4, 2, 3, 3), (4, 2, 2, 2), (1, 1, 1, 1),
])
def test_launches_as_many_as_fit_down_to_min_workers(num_workers, min_workers, capacity, workers):
    assert workers_to_launch(num_workers, min_workers, capacity) == workers


def test_below_min_workers_the_try_fails_with_the_numbers():
    with pytest.raises(NotEnoughCapacity, match=r"can place 1 worker\(s\) now and this task needs at least 2 "
                                                r"\(of 4\).*lower min_workers"):
        workers_to_launch(4, 2, 1)


@pytest.mark.parametrize("min_workers", [0, 5])
def test_min_workers_outside_one_to_num_workers_is_refused(min_workers):
    with pytest.raises(ValueError, match="use 1 <= min_workers <= num_workers"):
        workers_to_launch(4, min_workers, 4)
