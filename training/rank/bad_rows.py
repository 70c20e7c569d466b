"""Which rows of a minibatch alone give a non-finite loss or gradient: a bounded bisection over a test.

`is_bad(rows)` runs a forward and backward pass on those rows and says whether anything came out NaN/Inf.
A bad set is split in halves and each half tested; a half that is bad alone is split again, down to single
rows, which are the answer. A row that is bad only together with others (a batch whose sum overflows, say)
is never named: the halves both test clean and the search stops there. With d bad rows among n the search
costs about 2·d·log2(n) tests; it stops at `max_tests` or when `out_of_time()` says so, and says that it
did (`complete`), keeping the rows found so far. Pure: table-tested with fake tests
(tests/training/rank/test_bad_rows.py).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

# Enough for a handful of bad rows in a minibatch of a few thousand (2·d·log2(n): 4 rows of 4096 ≈ 96).
MAX_ROW_TESTS = 96


@dataclasses.dataclass(frozen=True)
class BadRowSearch:
    rows: tuple[int, ...]  # positions (into the rows searched) that are bad alone, ascending
    tests: int             # how many times `is_bad` ran
    complete: bool         # False: stopped by max_tests or the time limit; more bad rows may remain


def find_bad_rows(rows: Sequence[int], is_bad: Callable[[Sequence[int]], bool], max_tests: int = MAX_ROW_TESTS,
                  out_of_time: Callable[[], bool] = lambda: False) -> BadRowSearch:
    """The rows of `rows` (already known to be bad together) that are bad alone, by bisection."""
    found: list[int] = []
    tests = 0
    todo = [list(rows)]  # sets known to be bad, each to be split
    while todo:
        bad = todo.pop()
        if len(bad) == 1:
            found.append(bad[0])
            continue
        middle = len(bad) // 2
        for half in (bad[middle:], bad[:middle]):  # the first half popped first: rows come out in order
            if tests >= max_tests or out_of_time():
                return BadRowSearch(tuple(sorted(found)), tests, complete=False)
            tests += 1
            if is_bad(half):
                todo.append(half)
    return BadRowSearch(tuple(sorted(found)), tests, complete=True)
