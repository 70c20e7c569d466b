"""The bounded bisection that names the rows of a minibatch that are non-finite alone (fake tests)."""
import pytest

from ringflow.training.rank.bad_rows import find_bad_rows


def bad_if_any(bad):
    return lambda rows: any(r in bad for r in rows)


# (rows, the fake test, max tests) -> (rows named, complete)
ROWS = {
    "one bad row of 32": (range(32), bad_if_any({7}), 96, (7,), True),
    "three bad rows": (range(64), bad_if_any({0, 31, 63}), 96, (0, 31, 63), True),
    "every row bad": (range(4), bad_if_any({0, 1, 2, 3}), 96, (0, 1, 2, 3), True),
    "bad only together: nobody named": (range(16), lambda rows: {2, 9} <= set(rows), 96, (), True),
    "one bad row alone, two only together": (range(16), lambda rows: 5 in rows or {10, 12} <= set(rows), 96, (5,),
                                            True),
    "out of tests: what was found so far": (range(1024), bad_if_any(set(range(0, 1024, 64))), 12, (), False),
    "a single row already known bad": ([9], bad_if_any(set()), 96, (9,), True),
}


@pytest.mark.parametrize("name", ROWS)
def test_the_search(name):
    rows, is_bad, max_tests, named, complete = ROWS[name]
    search = find_bad_rows(rows, is_bad, max_tests)
    assert (search.rows, search.complete) == (named, complete)
    assert search.tests <= max_tests


def test_its_cost_is_logarithmic():
    search = find_bad_rows(range(4096), bad_if_any({1234}))
    assert search.rows == (1234,) and search.tests == 2 * 12  # two halves tested at each of log2(4096) levels


def test_the_time_limit_stops_it():
    ticks = iter(range(100))
    search = find_bad_rows(range(256), bad_if_any({3, 200}), out_of_time=lambda: next(ticks) >= 5)
    assert not search.complete and search.tests == 5
