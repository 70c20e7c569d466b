"""The job's samples/s as the peers count theirs: every rank's samples and time over the same steps between
two barriers, the slowest rank's rate times the number of ranks (bench/peer_worker.py uses the same
function)."""
import re

import pytest
import torch

from ringflow.training.rank.callbacks.throughput import WARMUP_STEPS, Throughput, job_samples_per_sec
from ringflow.training.rank.loop import StepTiming


@pytest.mark.parametrize("samples, seconds, expected", [
    ([2560.0], [1.0], 2560.0),                        # one rank: its own rate
    ([2560.0, 2560.0], [1.0, 1.0], 5120.0),           # two alike: twice one
    ([2560.0, 2560.0], [1.0, 2.0], 2560.0),           # the slower rank sets the job's rate
    ([2560.0, 1280.0], [1.0, 1.0], 2560.0),           # fewer rows in the same time is slower too
    ([100.0, 100.0, 100.0, 100.0], [1.0, 1.0, 1.0, 4.0], 100.0),
])
def test_the_job_runs_at_its_slowest_ranks_rate_times_the_ranks(samples, seconds, expected):
    assert job_samples_per_sec(samples, seconds) == pytest.approx(expected)


@pytest.mark.parametrize("samples, seconds, says", [
    ([], [], "one (samples, seconds) pair per rank"),
    ([1.0, 2.0], [1.0], "one (samples, seconds) pair per rank"),
    ([1.0], [0.0], "time at least one step"),
])
def test_rates_that_cannot_be_taken_say_why(samples, seconds, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        job_samples_per_sec(samples, seconds)


class TwoRanks:
    """Rank 0 of two: every allgather is recorded; the other rank took `other_seconds` for its samples."""

    rank, size = 0, 2

    def __init__(self, other_seconds: float):
        self.other_seconds, self.gathers = other_seconds, []

    def allgather(self, tensor, name):
        self.gathers.append(name)
        other = tensor.clone()
        if name == "ringflow.throughput":
            other[0, 1] = self.other_seconds
        return torch.cat([tensor, other])


class OneRank(TwoRanks):
    size = 1


class Loop:
    step = 0


def run(engine, steps: int, samples_per_step: int = 256) -> Throughput:
    throughput = Throughput(engine, monitor_seconds=lambda: 0.0)
    throughput.on_train_start(Loop())
    for step in range(1, steps + 1):
        throughput.on_step_end(Loop(), StepTiming(step, 0, 0.001, 0.0, samples_per_step))
    throughput.on_train_end(Loop())
    return throughput


def test_the_slowest_rank_up_to_the_closing_barrier_sets_the_rate():
    engine = TwoRanks(other_seconds=100.0)  # rank 1 took far longer than rank 0's own clock says
    throughput = run(engine, WARMUP_STEPS + 40)
    assert throughput.samples_per_sec == pytest.approx(40 * 256 / 100.0 * 2)
    # Both ends of the timed steps are barriers, and the rows are gathered after the closing one.
    assert engine.gathers == ["ringflow.throughput.start", "ringflow.throughput.end", "ringflow.throughput"]
    assert throughput.monitor_share == 0.0


def test_one_rank_counts_its_own_time_with_no_collective():
    engine = OneRank(other_seconds=100.0)
    throughput = run(engine, WARMUP_STEPS + 40)
    assert engine.gathers == []
    assert 40 * 256 / 100.0 < throughput.samples_per_sec  # its own time, far under the 100 s above


def test_a_run_no_longer_than_the_warm_up_reports_no_rate_and_gathers_nothing():
    engine = TwoRanks(other_seconds=1.0)
    throughput = run(engine, WARMUP_STEPS)
    assert throughput.samples_per_sec is None and throughput.monitor_share is None
    assert engine.gathers == ["ringflow.throughput.start"]  # every rank reached the warm step, none timed a step
