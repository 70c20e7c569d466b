"""How many workers a try launches: the task's num_workers, or fewer when the cluster lost capacity and the
task allows it (`min_workers`). Pure, table-tested (tests/training/core/test_worker_count.py).

A retry may ask for fewer workers than the first try because training resumes sample-exact on any number of
workers (a current manifest's global cursor, rank/stream_deal.py), with the accumulation and the learning rate
rescaled (rank/world_size_change.py). Below min_workers the try fails with the numbers: the run would be too
slow to be worth it, or the user said so; the task's retries try again later, when capacity may be back.
"""
from __future__ import annotations


class NotEnoughCapacity(RuntimeError):
    """The cluster can place fewer workers than min_workers: the message has the numbers."""


def workers_to_launch(num_workers: int, min_workers: int, capacity: int) -> int:
    """min(num_workers, capacity), if that is at least min_workers; else NotEnoughCapacity."""
    if not 1 <= min_workers <= num_workers:
        raise ValueError(f"min_workers is {min_workers} with num_workers {num_workers}: use 1 <= min_workers <= "
                         f"num_workers (or leave it unset: exactly num_workers)")
    workers = min(num_workers, capacity)
    if workers < min_workers:
        raise NotEnoughCapacity(
            f"the cluster can place {capacity} worker(s) now and this task needs at least {min_workers} (of "
            f"{num_workers}): wait for capacity (the task's retries try again), add nodes, or lower min_workers")
    return workers
