"""Fault injection through the job config: each fault yields its verdict, evidence and exit code, under
either engine (Horovod under horovodrun, DDP under torchrun) where the engines measure it each their own way (the
gradients' NaN, a straggler's compute, the replicas' checksums); once where the measurement is the engines' shared
code (when a NaN found between measurements is caught: one setting on each engine; a hang: the rank's watchdog
and heartbeat, which do not depend on the engine)."""

import pytest
import torch

from ringflow.training.formats import exit_codes
from ringflow.training.health.heartbeat import read_heartbeat
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import LocalFolderStore

pytestmark = pytest.mark.job


@pytest.fixture(params=["horovod", "ddp"])
def engine(request) -> str:
    return request.param


def run_fault(jobs, engine, name, fault, health=None):
    cfg = jobs.config(f"{name}-{engine}", epochs=3, faults=[fault], health=health or {}, engine=engine)
    code, out = jobs.run(cfg)
    assert jobs.result(cfg) is not None, out
    return code, out, jobs.result(cfg).verdict.to_dict()


# Measured every 10th step, on one engine with the every-step NaN check and on the other without (the catch is the
# engines' shared code: one setting on each engine).
@pytest.mark.parametrize("engine, every_step, detected_at", [("horovod", True, 12), ("ddp", False, 20)])
def test_nan_gradient_on_one_rank_is_nonfinite_and_never_reaches_a_checkpoint(jobs, engine, every_step, detected_at):
    """Rank 1's gradient is NaN at step 12. Measured every 10th step, the NaN is found at step 20 (a measurement
    and checkpoint step), before that checkpoint is written; checked every step, found at step 12, never
    applied. Either way the verdict names where it began (rank 1, step 12), and the replay of that step from
    the step-10 checkpoint is finite: an injected NaN is no property of the data (transient)."""
    name = f"nan-{every_step}"
    code, out, verdict = run_fault(jobs, engine, name, {"kind": "nan_gradient", "rank": 1, "step": 12},
                                   health={"every_steps": 10, "checksum_every_steps": 50,
                                           "nonfinite_every_step": every_step})
    assert code == exit_codes.BY_VERDICT["NONFINITE"], out
    assert verdict["status"] == "NONFINITE" and verdict["evidence"]["step"] == 12, verdict
    assert verdict["evidence"]["ranks"] == [1] and verdict["evidence"]["detected_at_step"] == detected_at
    assert "health verdict NONFINITE" in out
    replay = verdict["evidence"]["replay"]
    assert replay["reproducible"] is False and replay["rows"] == [] and replay["step"] == 12, replay
    assert replay["checkpoint_step"] == 10 and replay["reason"].startswith("transient:")
    cfg = jobs.config(f"{name}-{engine}")
    parameters = jobs.final_parameters(cfg)  # the newest valid checkpoint
    assert jobs.result(cfg).checkpoint is None
    assert all(torch.isfinite(t).all() for t in parameters.values())
    assert jobs.checkpoints(cfg).names() == ["ckpt-000000010"]


def test_slow_rank_is_degraded_and_named(jobs, engine):
    code, out, verdict = run_fault(jobs, engine, "slow", {"kind": "slow_rank", "rank": 1, "step": 3, "seconds": 0.05},
                                   health={"stop_on_degraded": True, "window_steps": 10})
    assert code == exit_codes.BY_VERDICT["DEGRADED"], out
    assert verdict["status"] == "DEGRADED" and verdict["evidence"]["kind"] == "straggler"
    assert verdict["evidence"]["rank"] == 1 and "rank 1" in verdict["reason"]


def test_perturbed_replica_is_diverged(jobs, engine):
    code, out, verdict = run_fault(jobs, engine, "perturb", {"kind": "perturb_replica", "rank": 1, "step": 7})
    assert code == exit_codes.BY_VERDICT["DIVERGED"], out
    assert verdict["status"] == "DIVERGED" and verdict["evidence"]["rank"] == 1
    assert verdict["evidence"]["step"] == 10  # the first checksum after the perturbation


@pytest.mark.parametrize("engine", ["horovod"])
def test_hang_is_stalled(jobs, engine):
    code, out, verdict = run_fault(jobs, engine, "hang", {"kind": "hang", "rank": 1, "step": 5},
                                   health={"stall_seconds": 4})
    assert code == exit_codes.BY_VERDICT["STALLED"] == 5, out
    assert verdict["status"] == "STALLED" and verdict["evidence"]["last_step"] == 4
    assert verdict["evidence"]["seconds"] > verdict["evidence"]["limit"] == 4
    # The heartbeat went on while the loop hung, and said so: no progress after step 4.
    heartbeat = read_heartbeat(RunFolder(LocalFolderStore(jobs.config(f"hang-{engine}")["run_uri"])).current_store())
    assert heartbeat.step == 4 and heartbeat.state == "running" and heartbeat.seq >= 3
