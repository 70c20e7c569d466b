"""The monitor's local measurements: gradient norm, parameter checksum, the first non-finite loss."""
import math

import pytest
import torch

from ringflow.training.health.monitor import first_nonfinite_on_device, gradient_norm, parameter_checksum


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
    """The monitor's view of an engine: gathers return this rank's own rows; starts are counted."""

    def __init__(self, size=2):
        self.size, self.started = size, []

    def allgather(self, tensor, name):
        self.started.append(name)
        return tensor

    def allgather_async(self, tensor, name):
        self.started.append(name)
        return tensor

    def wait(self, handle):
        return handle


def test_no_gather_starts_after_a_verdict_that_stops_the_job(tmp_path):
    from ringflow.training.config import HealthConfig
    from ringflow.training.health.monitor import SyncHealthMonitor
    from ringflow.training.health.records import HealthLog
    from ringflow.training.store import LocalFolderStore

    engine = OneRankEngine()
    monitor = SyncHealthMonitor(engine, HealthConfig(),
                                HealthLog(LocalFolderStore(str(tmp_path))), batch_size=4)
    assert monitor.on_step(10, 0, 0.1, 0.01, float("nan"), 1.0) is None  # gathered, judged next time
    verdict = monitor.on_checksum(10, torch.nn.Linear(2, 1))
    assert verdict.status == "NONFINITE"
    # A rank that stopped on it has left the job: a gather started now would fail on the others.
    assert engine.started == ["ringflow.health.step"]
    assert monitor.on_step(20, 0, 0.1, 0.01, 0.5, 1.0) is None and engine.started[-1] == "ringflow.health.step"


def test_a_world_of_one_gathers_nothing_and_judges_the_same(tmp_path):
    from ringflow.training.config import HealthConfig
    from ringflow.training.health.monitor import SyncHealthMonitor
    from ringflow.training.health.records import HealthLog
    from ringflow.training.store import LocalFolderStore

    verdicts = {}
    for size in (1, 2):
        engine = OneRankEngine(size)
        monitor = SyncHealthMonitor(engine, HealthConfig(), HealthLog(LocalFolderStore(str(tmp_path / str(size)))), 4)
        monitor.on_step(10, 0, 0.1, 0.01, 0.5, 1.0)
        monitor.on_checksum(10, torch.nn.Linear(2, 1))
        verdicts[size] = (monitor.on_step(20, 0, 0.1, 0.01, float("nan"), 1.0), engine.started)
    assert verdicts[1][1] == [] and len(verdicts[2][1]) == 3
    assert verdicts[1][0].status == verdicts[2][0].status == "HEALTHY"
