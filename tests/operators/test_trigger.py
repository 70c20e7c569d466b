"""The training trigger: plain-JSON serialization, one event per run, never raising; what it does about a
fatal verdict; a retry after a stall (its health watch: tests/training/core/runs/test_health_watch.py)."""
import asyncio
import json

import pytest

from ringflow.operators.trigger import HorovodJobTrigger
from ringflow.training.formats import exit_codes
from ringflow.training.core.backends.job_spec import JobSpec
from ringflow.training.core.backends.local import LocalProcessBackend
from ringflow.training.formats.run_result import RunResult
from ringflow.training.rank.worker_env import ATTEMPT_ENV


def make_trigger(tmp_path, job_id="rf-x", **kwargs):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    return HorovodJobTrigger(backend_kind="local", backend_kwargs=backend.to_dict(), job_id=job_id,
                             run_uri=str(tmp_path / "run"), poll_interval=0.2, **kwargs)


def events(trigger):
    async def collect():
        return [event.payload async for event in trigger.run()]
    return asyncio.run(collect())


def test_serialization_round_trip(tmp_path):
    trigger = make_trigger(tmp_path, health={"stall_seconds": 30}, timeout_at=123.0, log_cursor=42, attempt="a1")
    classpath, kwargs = trigger.serialize()
    assert classpath == "ringflow.operators.trigger.HorovodJobTrigger"
    kwargs = json.loads(json.dumps(kwargs))  # plain JSON, nothing else
    rebuilt = HorovodJobTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


@pytest.mark.parametrize("result, waited, action", [
    (None, False, "wait"),            # the job may be about to stop itself: one poll for it
    (None, True, "stop"),             # it did not: the trigger stops it
    ("failed", False, "stopped_itself"),
    ("failed", True, "stopped_itself"),
    ("succeeded", False, "let_finish"),  # its work is done and recorded: a late stall is not a failure
])
def test_what_the_trigger_does_about_a_fatal_verdict(result, waited, action):
    from ringflow.operators.trigger import on_fatal_verdict
    from ringflow.training.health.verdict import Verdict

    written = result and RunResult(status=result, attempt="rf-1", step=5, epoch=0, world_size=2,
                                   checkpoint="ckpt-000000005" if result == "succeeded" else None,
                                   verdict=Verdict("STALLED", "no step") if result == "failed" else None)
    assert on_fatal_verdict(written or None, waited) == action


def test_unknown_job_yields_one_error_event_instead_of_raising(tmp_path):
    (got,) = events(make_trigger(tmp_path, job_id="rf-missing"))
    assert got["status"] == "error" and "rf-missing" in got["message"]


@pytest.mark.slow
def test_success_and_fatal_verdict(tmp_path, digits_manifest):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1}
    backend.launch(JobSpec(name="rf-good", config=config, num_workers=2))
    (ok,) = events(make_trigger(tmp_path, job_id="rf-good"))
    assert ok["status"] == "success" and ok["state"] == "succeeded" and ok["exit_code"] == 0

    config = config | {"run_uri": str(tmp_path / "run2"), "epochs": 3,
                       "faults": [{"kind": "nan_gradient", "rank": 1, "step": 4}]}
    backend.launch(JobSpec(name="rf-nan", config=config, num_workers=2))
    trigger = make_trigger(tmp_path, job_id="rf-nan")
    trigger.run_uri = str(tmp_path / "run2")
    (bad,) = events(trigger)
    assert bad["status"] == "error" and bad["verdict"]["status"] == "NONFINITE"
    assert bad["verdict"]["evidence"]["ranks"] == [1]
    # The job judged itself and stopped with its result: its own verdict and exit code, not the trigger's.
    assert bad["stopped_by"] == "job" and bad["exit_code"] == exit_codes.BY_VERDICT["NONFINITE"], bad
    result = RunResult.from_json(bad["result"])
    assert result.verdict.status == "NONFINITE" and result.attempt == bad["verdict"]["attempt"]
    assert RunResult.from_json(ok["result"]).succeeded and ok["stopped_by"] == "job"


@pytest.mark.slow
def test_a_job_the_trigger_stops_is_told_from_one_that_stopped_itself(tmp_path, digits_manifest):
    """The job would wait 60 s for its own watchdog; the trigger's limit is 3 s: the trigger stops it."""
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2)
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1,
              "health": {"stall_seconds": 60, "heartbeat_seconds": 0.5},
              "faults": [{"kind": "hang", "rank": 1, "step": 3}]}
    backend.launch(JobSpec(name="rf-hang", config=config, num_workers=2, env={ATTEMPT_ENV: "rf-hang"}))
    (got,) = events(make_trigger(tmp_path, job_id="rf-hang", attempt="rf-hang",
                                 health={"stall_seconds": 3, "heartbeat_seconds": 0.5}))
    assert got["status"] == "error" and got["stopped_by"] == "trigger", got
    assert got["verdict"]["status"] == "STALLED" and got["verdict"]["evidence"]["last_step"] == 2, got
    assert got["result"] is None and "stopped job rf-hang" in got["message"]
    assert backend.status("rf-hang").finished


@pytest.mark.slow
def test_on_kill_stops_the_watched_job(tmp_path, digits_manifest):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2)
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1,
              "faults": [{"kind": "hang", "rank": 0, "step": 1}]}
    backend.launch(JobSpec(name="rf-killed", config=config, num_workers=2))
    assert backend.status("rf-killed").state == "running"
    asyncio.run(make_trigger(tmp_path, job_id="rf-killed").on_kill())
    status = backend.status("rf-killed")
    assert status.finished and status.reason == "stopped on request", status


@pytest.mark.slow
def test_timeout_stops_the_job(tmp_path, digits_manifest):
    import time

    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2)
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1,
              "faults": [{"kind": "hang", "rank": 0, "step": 2}]}
    backend.launch(JobSpec(name="rf-slow", config=config, num_workers=2))
    (got,) = events(make_trigger(tmp_path, job_id="rf-slow", timeout_at=time.time() + 8))
    assert got["status"] == "timeout" and got["stopped_by"] == "trigger"
    assert backend.status("rf-slow").finished


@pytest.mark.slow
@pytest.mark.parametrize("health", [{"enabled": False}, {"every_steps": 1000, "checksum_every_steps": 1000}],
                         ids=["health-off", "sparse-records"])
def test_slow_steps_without_records_for_longer_than_stall_seconds_are_not_killed(tmp_path, digits_manifest,
                                                                                  health):
    """22 steps of 0.5 s: no health record for 11 s, stall_seconds 4. The old watcher stopped this job."""
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1,
              "health": health | {"stall_seconds": 4},
              "faults": [{"kind": "slow_rank", "rank": 1, "step": 1, "seconds": 0.5}]}
    backend.launch(JobSpec(name="rf-slow-steps", config=config, num_workers=2))
    (got,) = events(make_trigger(tmp_path, job_id="rf-slow-steps", health=config["health"]))
    assert got["status"] == "success" and got["exit_code"] == 0, got
    assert got["verdict"] is None or got["verdict"]["status"] != "STALLED", got


@pytest.mark.slow
def test_retry_after_a_stall_recovers(tmp_path, digits_manifest):
    """Attempt 1 hangs and is STALLED; attempt 2 in the same run folder is judged on its own records only
    (before, attempt 1's `stall` record stopped it at once) and succeeds from attempt 1's checkpoint."""
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "checkpoint": {"every_steps": 10},
              "epochs": 1, "health": {"stall_seconds": 3},
              "faults": [{"kind": "hang", "rank": 1, "step": 15}]}
    backend.launch(JobSpec(name="rf-try-1", config=config, num_workers=2))
    (first,) = events(make_trigger(tmp_path, job_id="rf-try-1", health=config["health"]))
    assert first["status"] == "error" and (first["verdict"] or {}).get("status") == "STALLED", first
    del config["faults"]
    backend.launch(JobSpec(name="rf-try-2", config=config, num_workers=2))
    (second,) = events(make_trigger(tmp_path, job_id="rf-try-2", health=config["health"]))
    assert second["status"] == "success", second
    assert second["verdict"]["status"] == "HEALTHY" and second["verdict"]["attempt"] != first["verdict"]["attempt"]
    result = RunResult.from_json(second["result"])
    assert result.succeeded and result.resumed_from == "ckpt-000000010" and result.attempt == second["verdict"]["attempt"]
