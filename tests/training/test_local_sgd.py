"""Post-local SGD (ddp.local_sgd) in real 2-process DDP jobs on CPU: averaging every 4 steps after 6
synchronous ones, an uninterrupted run beside one whose rank 1 is SIGKILLed at step 27 and resumed. The jobs
are built once for the module; each test reads what they left."""
import re

import pytest
import torch

from ringflow.training.health.replica_schedule import ReplicaSchedule
from ringflow.training.health.verdict import HEALTHY, judge
from ringflow.training.formats.config import HealthConfig
from ringflow.training.rank.training_state import STATE_FILE, TrainingState

pytestmark = pytest.mark.job

PERIOD, WARMUP = 4, 6
LOCAL_SGD = {"bucket_cap_mb": 25, "local_sgd": {"period": PERIOD, "warmup_steps": WARMUP}}


@pytest.fixture(scope="module")
def runs(module_jobs):
    jobs = module_jobs
    reference = jobs.config("uninterrupted", epochs=2, engine="ddp", ddp=LOCAL_SGD)
    code, out = jobs.run(reference)
    assert code == 0, out
    interrupted = jobs.config("interrupted", epochs=2, engine="ddp", ddp=LOCAL_SGD,
                              faults=[{"kind": "crash", "rank": 1, "step": 27}])
    code, crashed_out = jobs.run(interrupted)
    assert code != 0 and "SIGKILL at step 27" in crashed_out
    del interrupted["faults"]
    code, resumed_out = jobs.run(interrupted)
    assert code == 0, resumed_out
    return jobs, reference, interrupted, out, resumed_out


def state_of(jobs, cfg, name) -> TrainingState:
    return TrainingState.from_bytes(jobs.checkpoints(cfg).load(name).files[STATE_FILE], name)


def test_checkpoints_land_on_averages_and_keep_every_rank_s_optimizer(runs):
    jobs, reference, _, _, _ = runs
    last = jobs.result(reference).step
    schedule = ReplicaSchedule(PERIOD, WARMUP, last)
    names = jobs.checkpoints(reference).names()
    assert names
    for name in names:
        state = state_of(jobs, reference, name)
        assert schedule.agree_after(state.step), (name, state.step)
        # The averager's step is in the optimizer state (torch's PostLocalSGDOptimizer) and is the loop's.
        assert state.optimizer["step"] == state.step
        assert [s["step"] for s in state.replica_optimizers] == [state.step, state.step]
    # Between averages the ranks' momenta differ: the checkpoint keeps both, not rank 0's twice.
    final = state_of(jobs, reference, jobs.result(reference).checkpoint)
    moments = [s["state"][0]["exp_avg"] for s in final.replica_optimizers]
    assert not torch.equal(*moments)


def test_resumed_run_averages_at_the_same_steps_and_ends_with_the_same_parameters(runs):
    jobs, reference, interrupted, _, resumed_out = runs
    resumed = jobs.result(interrupted).resumed_from
    step = int(re.search(rf"resuming from checkpoint {resumed} \(step (\d+),", resumed_out)[1])
    assert ReplicaSchedule(PERIOD, WARMUP).agree_after(step)
    # The averager's step came back from the checkpoint's optimizer state, not from 0.
    assert re.search(rf"local SGD: .* averager at step {step}$", resumed_out, re.M), resumed_out[-3000:]
    expected, actual = jobs.final_parameters(reference), jobs.final_parameters(interrupted)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7)


def test_a_healthy_local_sgd_run_is_healthy_and_compares_checksums_after_averages(runs):
    jobs, reference, interrupted, _, _ = runs
    last = jobs.result(reference).step
    schedule = ReplicaSchedule(PERIOD, WARMUP, last)
    for cfg in (reference, interrupted):
        result = jobs.result(cfg)
        assert result.succeeded and result.verdict.status == HEALTHY, result.verdict
        records = jobs.health(cfg)
        assert judge(records, HealthConfig(divergence_tolerance=1e-5)).status == HEALTHY
        checksum_steps = [r["step"] for r in records if r["type"] == "checksum"]
        assert checksum_steps and all(schedule.agree_after(s) for s in checksum_steps)
        # Compared right after averages, and equal there.
        assert any(schedule.averages_at(s) for s in checksum_steps)
