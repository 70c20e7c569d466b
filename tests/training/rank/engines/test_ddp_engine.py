"""The DDP engine in one process (a Gloo world of one on 127.0.0.1): the communication hook's timing, no_sync
for accumulated passes, the unwrapped module, gathers. Two ranks under torchrun: test_ddp_training.py."""
import pytest
import torch
import torch.distributed as dist

from ringflow.training.formats.config import DdpConfig, JobConfig
from ringflow.training.rank.engines.ddp import DdpEngine, SyncClock
from ringflow.training.core.launcher import free_port


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("spans, exposed", [
    ([], 0.0),
    ([(1.0, 1.5)], 0.5),                          # one bucket: launch to done
    ([(1.0, 3.0), (2.0, 2.5)], 1.0),              # an early bucket still in flight after the last launch
    ([(1.0, 1.2), (2.0, 2.1)], 0.1),              # the early one was hidden behind backward
])
def test_exposed_allreduce_time(spans, exposed):
    clock = SyncClock()
    clock._spans = list(spans)
    assert clock.take() == pytest.approx(exposed)
    assert clock.take() == 0.0  # taken once


def test_only_every_kth_pass_all_reduces_and_checkpoints_see_the_users_module(world_of_one):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    engine = DdpEngine(DdpConfig(bucket_cap_mb=1.0, backward_passes_per_step=3), rank=0, size=1)
    optimizer = engine.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ddp = engine.training_model(model)
    assert engine.unwrap(ddp) is model and ddp.state_dict().keys() != model.state_dict().keys()
    ddp.register_comm_hook(None, engine.clock.hook)  # what distribute() does when there are peers
    hooked = []
    for i in range(6):
        ddp.train()
        ddp(torch.randn(2, 3)).sum().backward()
        hooked.append(bool(engine.clock._spans))
        engine.clock._spans.clear()
    assert hooked == [False, False, True, False, False, True]
    # The run's last step, 2 passes of 3: the engine is told before its last pass, which all-reduces; the
    # count starts again after it.
    for i in range(5):
        if i == 1:
            engine.end_step_early()
        ddp(torch.randn(2, 3)).sum().backward()
        hooked.append(bool(engine.clock._spans))
        engine.clock._spans.clear()
    assert hooked[6:] == [False, True, False, False, True]

    engine.broadcast_state(model, optimizer)  # a world of one: nothing changes, nothing hangs
    engine.sync_gradients(optimizer)
    assert engine.step_sync_seconds(0.25) == 0.25  # no all-reduce since the last step's
    gathered = engine.allgather(torch.tensor([[1.0, 2.0]], dtype=torch.float64), "x")
    assert gathered.tolist() == [[1.0, 2.0]]


def test_the_hook_times_each_step(world_of_one):
    model = torch.nn.Linear(3, 1)
    engine = DdpEngine(JobConfig.from_dict({"manifest_uri": "/m/manifest.json", "run_uri": "/r"}).ddp, 0, 1)
    optimizer = engine.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ddp = engine.training_model(model)
    ddp.register_comm_hook(None, engine.clock.hook)  # what distribute() does when there are peers
    ddp(torch.randn(2, 3)).sum().backward()
    engine.sync_gradients(optimizer)
    assert 0 < engine.step_sync_seconds(0.0) < 5


def test_a_single_rank_registers_no_timing_hook(world_of_one):
    """With no peer to wait for, DDP keeps its C++ all-reduce (no Python per bucket) and the sync time is 0."""
    model = torch.nn.Linear(3, 1)
    engine = DdpEngine(JobConfig.from_dict({"manifest_uri": "/m/manifest.json", "run_uri": "/r"}).ddp, 0, 1)
    optimizer = engine.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1))
    engine.training_model(model)(torch.randn(2, 3)).sum().backward()
    engine.sync_gradients(optimizer)
    assert engine.step_sync_seconds(0.0) == 0.0 and not engine.clock._spans


def test_local_sgd_averages_where_the_schedule_says_and_restores_its_counters(world_of_one, monkeypatch):
    """torch's PeriodicModelAverager and the engine's last-step average, against ReplicaSchedule's table; the
    averager's step in the optimizer state, and the counters a resume sets."""
    import torch.distributed.algorithms.model_averaging.utils as averaging
    from ringflow.training.rank.engines import local_sgd

    averaged_at = []
    step = {"now": 0}
    record = lambda params, group: averaged_at.append(step["now"])  # noqa: E731
    monkeypatch.setattr(averaging, "average_parameters_or_parameter_groups", record)
    monkeypatch.setattr(local_sgd, "average_parameters_or_parameter_groups", record)
    cfg = JobConfig.from_dict({"manifest_uri": "/m/manifest.json", "run_uri": "/r", "engine": "ddp",
                               "ddp": {"local_sgd": {"period": 4, "warmup_steps": 6}}})
    model = torch.nn.Linear(3, 1)
    engine = DdpEngine(cfg.ddp, 0, 1)
    optimizer = engine.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    schedule = engine.replica_schedule(0, 30)
    ddp = engine.training_model(model)
    for s in range(1, 31):
        step["now"] = s
        ddp(torch.randn(2, 3)).sum().backward()
        engine.sync_gradients(optimizer)
        engine.apply_gradients(optimizer)
        optimizer.zero_grad()
    assert averaged_at == [s for s in range(1, 31) if schedule.averages_at(s) or schedule.forced_average_at(s)]
    assert averaged_at == [7, 11, 15, 19, 23, 27, 30]
    saved = optimizer.state_dict()
    assert saved["step"] == 30  # torch's PostLocalSGDOptimizer keeps the averager's step with the state

    # A resume: the optimizer state comes back (torch restores the averager's step), then the counters are
    # set for the run's start step; the hook's counter stops at warm-up's end.
    fresh = DdpEngine(cfg.ddp, 0, 1)
    restored = fresh.distribute(torch.nn.Linear(3, 1), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    restored.load_state_dict(saved)
    assert fresh.local_sgd.averager.step == 30
    fresh.replica_schedule(23, 40)
    assert fresh.local_sgd.averager.step == 23 and fresh.local_sgd.state.iter == 6
    assert fresh.replica_optimizer_states(restored)[0]["step"] == 23
