"""When the replicas agree, and so when checksums are compared and checkpoints taken: pure decisions on step
numbers, tabled against torch's PeriodicModelAverager (averages after steps W+1, W+1+H, ...)."""
import pytest

from ringflow.training.health.replica_schedule import SYNCHRONOUS, ReplicaSchedule


def steps(predicate, upto=30):
    return [s for s in range(1, upto + 1) if predicate(s)]


@pytest.mark.parametrize("schedule, averages, agree", [
    (SYNCHRONOUS, [], list(range(1, 31))),
    (ReplicaSchedule(4, 0, 30), [1, 5, 9, 13, 17, 21, 25, 29], [1, 5, 9, 13, 17, 21, 25, 29, 30]),
    (ReplicaSchedule(4, 6, 30), [7, 11, 15, 19, 23, 27], [1, 2, 3, 4, 5, 6, 7, 11, 15, 19, 23, 27, 30]),
    (ReplicaSchedule(1, 0, 30), list(range(1, 31)), list(range(1, 31))),
    (ReplicaSchedule(16, 0, 30), [1, 17], [1, 17, 30]),
    (ReplicaSchedule(16, 0, 17), [1, 17], [1, 17]),  # the last step an average anyway: not forced
])
def test_averages_and_agreement(schedule, averages, agree):
    assert steps(schedule.averages_at) == averages
    assert steps(schedule.agree_after) == agree


def test_the_engine_forces_only_a_last_step_the_averager_skips():
    assert steps(ReplicaSchedule(16, 0, 30).forced_average_at) == [30]
    assert steps(ReplicaSchedule(16, 0, 17).forced_average_at) == []
    assert steps(SYNCHRONOUS.forced_average_at) == []


@pytest.mark.parametrize("schedule, every, due", [
    # Synchronous: exactly the multiples, as before local SGD existed.
    (SYNCHRONOUS, 5, [5, 10, 15, 20, 25, 30]),
    (ReplicaSchedule(4, 0, 30), 5, [5, 13, 17, 21, 25, 30]),   # the first agreement at or after 5, 10, 15, ...
    (ReplicaSchedule(4, 6, 30), 5, [5, 11, 15, 23, 27, 30]),   # warm-up steps agree; then averages
    (ReplicaSchedule(4, 0, 30), 10, [13, 21, 30]),
    (ReplicaSchedule(16, 0, 30), 5, [17, 30]),                  # several multiples between averages: one
    (ReplicaSchedule(1, 0, 30), 7, [7, 14, 21, 28]),
])
def test_checksums_and_checkpoints_are_due_at_the_first_agreement_after_each_multiple(schedule, every, due):
    assert steps(lambda s: schedule.due(s, every)) == due
    assert all(schedule.agree_after(s) for s in due)


@pytest.mark.parametrize("kwargs, says", [({"period": 0}, "period is 0"), ({"period": 4, "warmup_steps": -1},
                                                                            "warmup_steps is -1")])
def test_bad_schedules_say_so(kwargs, says):
    with pytest.raises(ValueError, match=says):
        ReplicaSchedule(**kwargs)
