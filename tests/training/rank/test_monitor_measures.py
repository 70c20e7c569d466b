"""The monitor's local measurements: gradient norm, parameter checksum, the first non-finite loss."""
import math

import pytest
import torch

from ringflow.training.rank.monitor import first_nonfinite_on_device, gradient_norm, parameter_checksum


def test_gradient_norm_is_the_norm_of_all_gradients_together():
    a, b, unused = torch.zeros(3, requires_grad=True), torch.zeros(2, 2, requires_grad=True), torch.zeros(4)
    a.grad, b.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([[0.0, 4.0], [0.0, 0.0]])
    assert gradient_norm([a, b, unused]) == 5.0  # a parameter without a gradient counts as none
    assert gradient_norm([unused]) == 0.0
    b.grad[1, 1] = float("nan")
    assert math.isnan(gradient_norm([a, b]))
    b.grad[1, 1] = float("inf")
    assert gradient_norm([a, b]) == float("inf")


def test_checksum_sees_swapped_values_a_sum_would_miss():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    before = parameter_checksum(model)
    with torch.no_grad():
        w = model.weight
        w[0, 0], w[0, 1] = w[0, 1].item(), w[0, 0].item()
    assert parameter_checksum(model) != before


# losses of steps 1, 2, 3, ... -> the first step whose loss was not finite (-1: none)
@pytest.mark.parametrize("losses, first", [
    ([0.5, 0.4, 0.3], -1),
    ([0.5, float("nan"), 0.3], 2),
    ([float("inf"), float("nan")], 1),  # the first one stays, later ones do not move it
    ([0.5, 0.4, float("-inf"), float("nan")], 3),
])
def test_the_first_nonfinite_loss_is_kept_beside_the_loss_without_reading_it(losses, first):
    kept = None
    for step, value in enumerate(losses, start=1):
        kept = first_nonfinite_on_device(kept, torch.tensor(value), step)
        assert kept.device == torch.tensor(value).device and kept.dtype == torch.int64
    assert int(kept) == first


class OneRankEngine:
    """The monitor's view of an engine: gathers return this rank's own rows; starts and waits are counted."""

    def __init__(self, size=2):
        self.size, self.started, self.waited = size, [], []

    def allgather(self, tensor, name):
        self.started.append(name)
        return tensor

    def allgather_async(self, tensor, name):
        self.started.append(name)
        return name, tensor

    def wait(self, handle):
        self.waited.append(handle[0])
        return handle[1]


def make_monitor(tmp_path, size=2, **health):
    from ringflow.training.formats.config import HealthConfig
    from ringflow.training.rank.monitor import SyncHealthMonitor
    from ringflow.training.health.records import HealthLog
    from ringflow.training.store import LocalFolderStore

    engine = OneRankEngine(size)
    store = LocalFolderStore(str(tmp_path / f"run-{size}"))
    return engine, SyncHealthMonitor(engine, HealthConfig(**health), HealthLog(store), batch_size=4)


def test_no_gather_starts_after_a_verdict_that_stops_the_job(tmp_path):
    engine, monitor = make_monitor(tmp_path)
    assert monitor.on_step(10, 0, 0.1, 0.01, float("nan"), 1.0) is None  # gathered, judged next time
    assert monitor.on_checksum(10, torch.nn.Linear(2, 1)) is None  # step 10's gather is still in flight
    verdict = monitor.on_step(20, 0, 0.1, 0.01, 0.5, 1.0)
    assert verdict.status == "NONFINITE" and verdict.evidence["step"] == 10
    # A rank that stopped on it has left the job: a gather started now would fail on the others.
    assert engine.started == ["ringflow.health.step", "ringflow.health.checksum"]
    assert monitor.last_verdict == verdict


def test_a_checksum_does_not_wait_for_the_step_gather_started_at_its_own_step(tmp_path):
    """Waiting for it there cost a whole Horovod cycle at every checksum; it is collected one measurement
    later like every other gather, and the records still come in step order."""
    engine, monitor = make_monitor(tmp_path)
    monitor.on_step(50, 0, 0.1, 0.01, 0.5, 1.0)
    monitor.on_checksum(50, torch.nn.Linear(2, 1))
    assert engine.waited == []
    monitor.on_step(60, 0, 0.1, 0.01, 0.5, 1.0)
    assert engine.waited == ["ringflow.health.step", "ringflow.health.checksum"]
    # A checksum step without a step measurement (every_steps does not divide it) collects what is older.
    monitor.on_checksum(75, torch.nn.Linear(2, 1))
    assert engine.waited[-1] == "ringflow.health.step"
    monitor.collect()
    assert engine.waited[-1] == "ringflow.health.checksum"
    monitor._log.flush(force=True)
    from ringflow.training.health.records import read_health_in

    assert [(r["type"], r["step"]) for r in read_health_in(monitor._log._store)] == [
        ("step", 50), ("checksum", 50), ("step", 60), ("checksum", 75)]


@pytest.mark.parametrize("stop_on_degraded", [False, True])
def test_the_window_verdict_is_judged_when_asked_and_stops_the_job_only_if_configured(tmp_path, stop_on_degraded):
    engine, monitor = make_monitor(tmp_path, stop_on_degraded=stop_on_degraded)
    returned = []
    for step in range(10, 90, 10):  # every step spends 90 % of its time in the all-reduce: sync-bound
        returned.append(monitor.on_step(step, 0, 0.1, 0.09, 0.5, 1.0))
        if returned[-1] is not None:
            break
    assert monitor.last_verdict.status == "DEGRADED"
    if stop_on_degraded:  # at the measurement that collected the fifth record, the fewest that judge it
        assert returned[-1].status == "DEGRADED" and len(returned) == 6
        assert engine.started.count("ringflow.health.step") == 5  # none after the verdict
    else:
        assert returned == [None] * 8


def test_a_world_of_one_gathers_nothing_and_judges_the_same(tmp_path):
    verdicts = {}
    for size in (1, 2):
        engine, monitor = make_monitor(tmp_path, size)
        monitor.on_step(10, 0, 0.1, 0.01, 0.5, 1.0)
        monitor.on_checksum(10, torch.nn.Linear(2, 1))
        returned = monitor.on_step(20, 0, 0.1, 0.01, float("nan"), 1.0)
        verdicts[size] = (returned, monitor.last_verdict, engine.started)
    assert verdicts[1][2] == [] and len(verdicts[2][2]) == 3
    assert verdicts[1][0] is verdicts[2][0] is None
    assert verdicts[1][1].status == verdicts[2][1].status == "HEALTHY"
