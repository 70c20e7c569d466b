"""The global sample cursor of the shards (manifest.py): what of an epoch is still unseen, and
how it is dealt to however many workers there are now. Pure functions of numbers: no store, no torch.

An epoch is one stream of positions 0..N-1 (partition_batches.epoch_windows orders the rows of every file
into it). `Ranges` are half-open [start, stop) runs of positions in stream order: the part of the epoch not
yet trained on. `deal(remaining, world_size)` cuts their concatenation into world_size contiguous runs of equal
length, the < world_size leftover rows one each to the first ranks; a rank takes micro-batches of
`batch_size` rows from its run's start, its last one partial. Every rank takes as many micro-batches as the
longest run has (`micro_batches`): a rank past its run's end takes a micro-batch of no rows (a zero loss, so
it still joins the step's all-reduce) — that happens only when the runs differ by one row and the shorter
ones end on a micro-batch boundary.

After `taken` micro-batches of a deal, `advance` gives the new remaining ranges: each rank's run less the
rows it took. A checkpoint stores those, and a resume on M workers deals them to M: every row of the epoch
is trained on exactly once, whatever the world sizes before and after. With the world size unchanged the
deal of what `advance` left gives every rank the rest of the same run, so the order is the one an
uninterrupted run takes.
"""
from __future__ import annotations

from typing import Iterable, Sequence

Ranges = tuple[tuple[int, int], ...]


def whole(rows: int) -> Ranges:
    """An epoch nobody has started: every position."""
    return ((0, rows),) if rows > 0 else ()


def normalized(ranges: Iterable[Sequence[int]]) -> Ranges:
    """`ranges` as a tuple of (start, stop) pairs, empty ones dropped and touching ones joined; raises on a
    range that runs backwards (a corrupt cursor)."""
    out: list[tuple[int, int]] = []
    for pair in ranges:
        start, stop = int(pair[0]), int(pair[1])
        if start < 0 or stop < start:
            raise ValueError(f"stream range [{start}, {stop}) is not a range of positions")
        if start == stop:
            continue
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return tuple(out)


def length(ranges: Ranges) -> int:
    return sum(stop - start for start, stop in ranges)


def cut(ranges: Ranges, skip: int, take: int) -> Ranges:
    """Positions `skip` .. `skip + take` of the concatenation of `ranges`, as ranges."""
    out, at = [], 0
    for start, stop in ranges:
        size = stop - start
        lo, hi = max(skip - at, 0), min(skip + take - at, size)
        if lo < hi:
            out.append((start + lo, start + hi))
        at += size
        if at >= skip + take:
            break
    return normalized(out)


def run_lengths(total: int, world_size: int) -> list[int]:
    """How many rows each rank's run holds: equal shares, the leftover one each to the first ranks."""
    if world_size < 1:
        raise ValueError(f"world size is {world_size}; it must be >= 1")
    share, extra = divmod(total, world_size)
    return [share + (1 if r < extra else 0) for r in range(world_size)]


def deal(remaining: Ranges, world_size: int) -> list[Ranges]:
    """Each rank's run of `remaining`: contiguous pieces of its concatenation, in rank order."""
    runs, at = [], 0
    for size in run_lengths(length(remaining), world_size):
        runs.append(cut(remaining, at, size))
        at += size
    return runs


def micro_batches(remaining: Ranges, world_size: int, batch_size: int) -> int:
    """Micro-batches every rank takes in this deal: as many as the longest run fills (its last partial)."""
    longest = run_lengths(length(remaining), world_size)[0]
    return -(-longest // batch_size)


def advance(remaining: Ranges, world_size: int, batch_size: int, taken: int) -> Ranges:
    """What is still unseen after every rank took `taken` micro-batches of deal(remaining, world_size)."""
    left = [cut(run, taken * batch_size, length(run)) for run in deal(remaining, world_size)]
    return normalized(pair for run in left for pair in run)
