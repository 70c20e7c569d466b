"""A job's samples per second, counted the one way every engine and every peer in the benchmarks counts it.
Torch-free: the torch ranks (callbacks/throughput.py) and the TensorFlow ranks (tensorflow_worker.py) both
report it in result.json.
"""
from __future__ import annotations

from typing import Sequence

WARMUP_STEPS = 10


def job_samples_per_sec(samples: Sequence[float], seconds: Sequence[float]) -> float:
    """The job's rate from each rank's samples and seconds over the same timed steps (between barriers):
    the slowest rank's rate times the number of ranks. ringflow's result and every peer in the benchmarks
    use this one definition."""
    if not samples or len(samples) != len(seconds):
        raise ValueError(f"one (samples, seconds) pair per rank: got {len(samples)} samples, {len(seconds)} seconds")
    if min(seconds) <= 0:
        raise ValueError(f"a rank timed {min(seconds)} seconds; time at least one step")
    return min(n / t for n, t in zip(samples, seconds)) * len(samples)
