"""The training trigger: plain-JSON serialization, one event per run, never raising, never stopping the job
(what is decided on its event: tests/training/core/test_failure_policy.py; the operator stops the job); a
retry after a stall (its health watch: tests/training/core/runs/test_health_watch.py)."""
import asyncio
import json
import time

import pytest

from ringflow.operators.trigger import TrainJobTrigger
from ringflow.training.formats import exit_codes
from ringflow.training.core.backends.job_spec import JobSpec
from ringflow.training.core.backends.local import LocalProcessBackend
from ringflow.training.core.failure_policy import Action, Observation, decide
from ringflow.training.formats.run_result import RunResult
from ringflow.training.rank.worker_env import ATTEMPT_ENV


def make_trigger(tmp_path, job_id="rf-x", **kwargs):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    return TrainJobTrigger(backend_kind="local", backend_kwargs=backend.to_dict(), job_id=job_id,
                             run_uri=str(tmp_path / "run"), poll_interval=0.2, **kwargs)


def events(trigger):
    (got,) = events_side_by_side(trigger)
    return got


def events_side_by_side(*triggers):
    """Each trigger's events, the triggers run at once (as one triggerer runs them): jobs launched together
    are watched together, so a test of several jobs waits for the slowest, not for their sum."""
    async def collect(trigger):
        return [event.payload async for event in trigger.run()]

    async def collect_all():
        return await asyncio.gather(*(collect(t) for t in triggers))
    return asyncio.run(collect_all())


def decided(event):
    """What the operator decides on this event (the failure policy)."""
    return decide(Observation.from_dict(json.loads(json.dumps(event))))


def test_serialization_round_trip(tmp_path):
    trigger = make_trigger(tmp_path, health={"stall_seconds": 30}, timeout_at=123.0, log_cursor=42, attempt="a1")
    classpath, kwargs = trigger.serialize()
    assert classpath == "ringflow.operators.trigger.TrainJobTrigger"
    kwargs = json.loads(json.dumps(kwargs))  # plain JSON, nothing else
    rebuilt = TrainJobTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_unknown_job_yields_one_error_event_instead_of_raising(tmp_path):
    (got,) = events(make_trigger(tmp_path, job_id="rf-missing"))
    assert got["status"] == "error" and "rf-missing" in got["message"] and "rf-missing" in got["watch_error"]
    assert decided(got).action == Action.RETRY and not decided(got).stop_job  # a retry reattaches, if the job lives


@pytest.mark.job
def test_success_and_fatal_verdict(tmp_path, digits_manifest):
    """Also the local backend's own checks on these two real horovodrun jobs (tests/training/core/backends/
    test_local_backend.py has the rest): a running job is found by its labels, a finished one is not; its log is
    streamed from a cursor; a name is launched once; a failed job's state, exit code and reason."""
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1, "log_every_steps": 5}
    labels = {"dag": "d", "run": "r1", "task": "train"}
    backend.launch(JobSpec(name="rf-good", config=config, num_workers=2, labels=labels))
    assert backend.find({"dag": "d", "run": "r1"}) == "rf-good"
    nan_config = config | {"run_uri": str(tmp_path / "run2"), "epochs": 3,
                           "faults": [{"kind": "nan_gradient", "rank": 1, "step": 4}]}
    backend.launch(JobSpec(name="rf-nan", config=nan_config, num_workers=2))
    watch_nan = make_trigger(tmp_path, job_id="rf-nan")
    watch_nan.run_uri = str(tmp_path / "run2")
    (ok,), (bad,) = events_side_by_side(make_trigger(tmp_path, job_id="rf-good"), watch_nan)
    assert ok["status"] == "success" and ok["state"] == "succeeded" and decided(ok).exit_code == 0
    status = backend.status("rf-good")
    assert status.state == "succeeded" and status.exit_code == 0
    first = backend.logs("rf-good")
    assert any("step=5 epoch=1/1" in line for line in first.lines)
    assert backend.logs("rf-good", first.next_cursor).lines == []
    assert backend.find({"dag": "d", "run": "r1"}) is None  # finished jobs are not reattached
    with pytest.raises(FileExistsError):
        backend.launch(JobSpec(name="rf-good", config=config, num_workers=2, labels=labels))
    deadline = time.monotonic() + 60  # the event came with its result; its teardown may still be running
    while not backend.status("rf-nan").finished and time.monotonic() < deadline:
        time.sleep(0.2)
    failed = backend.status("rf-nan")
    assert failed.state == "failed" and failed.exit_code == exit_codes.BY_VERDICT["NONFINITE"] == 3
    assert "NONFINITE" in failed.reason and "NONFINITE" in failed.detail["log_tail"]

    decision = decided(bad)
    assert bad["status"] == "error" and decision.verdict.status == "NONFINITE" and decision.action == Action.FAIL
    assert decision.verdict.evidence["ranks"] == [1]
    # The job judged itself and stopped with its result: its own verdict and exit code.
    assert decision.exit_code == exit_codes.BY_VERDICT["NONFINITE"], bad
    assert not decision.stop_job or decision.stopped_itself, bad  # only its teardown is left to stop
    result = RunResult.from_json(bad["result"])
    assert result.verdict.status == "NONFINITE" and result.attempt == bad["attempt"]
    assert RunResult.from_json(ok["result"]).succeeded and not decided(ok).stop_job


@pytest.mark.job
@pytest.mark.background  # waits out stall_seconds: beside the main lane (scripts/test.sh)
def test_a_stall_the_trigger_sees_first_is_reported_and_the_operator_stops_the_job(tmp_path, digits_manifest):
    """The job would wait 60 s for its own watchdog; the trigger's limit is 3 s: it reports, the job runs on
    until the operator, deciding on the event, stops it."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from ringflow.operators.train import TrainOperator

    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2)
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1,
              "health": {"stall_seconds": 60, "heartbeat_seconds": 0.5},
              "faults": [{"kind": "hang", "rank": 1, "step": 3}]}
    backend.launch(JobSpec(name="rf-hang", config=config, num_workers=2, env={ATTEMPT_ENV: "rf-hang"}))
    (got,) = events(make_trigger(tmp_path, job_id="rf-hang", attempt="rf-hang",
                                 health={"stall_seconds": 3, "heartbeat_seconds": 0.5}))
    decision = decided(got)
    assert got["status"] == "error" and decision.stop_job and not decision.stopped_itself, got
    assert got["verdict"]["status"] == "STALLED" and got["verdict"]["evidence"]["last_step"] == 2, got
    assert got["result"] is None and decision.action == Action.RETRY
    assert backend.status("rf-hang").state == "running"  # the trigger stops nothing
    op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"), backend=backend)
    ti = {"ti": type("TI", (), {"dag_id": "d", "run_id": "r", "task_id": "train", "try_number": 1})()}
    with pytest.raises(AirflowException, match="STALLED.*stopped job rf-hang") as err:
        op.execute_complete(ti, json.loads(json.dumps(got)))
    assert not isinstance(err.value, AirflowFailException)  # a hang may pass: retried from its checkpoint
    assert backend.status("rf-hang").finished


@pytest.mark.job
def test_on_kill_stops_the_watched_job(tmp_path, digits_manifest):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2)
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1,
              "faults": [{"kind": "hang", "rank": 0, "step": 1}]}
    backend.launch(JobSpec(name="rf-killed", config=config, num_workers=2))
    assert backend.status("rf-killed").state == "running"
    asyncio.run(make_trigger(tmp_path, job_id="rf-killed").on_kill())
    status = backend.status("rf-killed")
    assert status.finished and status.reason == "stopped on request", status


@pytest.mark.job
def test_timeout_is_reported_for_the_operator_to_stop_the_job(tmp_path, digits_manifest):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2)
    config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1,
              "faults": [{"kind": "hang", "rank": 0, "step": 2}]}
    backend.launch(JobSpec(name="rf-slow", config=config, num_workers=2))
    (got,) = events(make_trigger(tmp_path, job_id="rf-slow", timeout_at=time.time() + 4))
    assert got["status"] == "timeout" and got["timed_out"] and decided(got).stop_job
    assert decided(got).action == Action.RETRY and backend.status("rf-slow").state == "running"
    backend.delete("rf-slow")


# Health off, and health records far apart: neither may pass for a stall.
SPARSE_HEALTH = {"health-off": {"enabled": False},
                 "sparse-records": {"every_steps": 1000, "checksum_every_steps": 1000}}


@pytest.mark.job
@pytest.mark.background  # waits out stall_seconds: beside the main lane (scripts/test.sh)
def test_slow_steps_without_records_for_longer_than_stall_seconds_are_not_killed(tmp_path, digits_manifest):
    """22 steps of 0.5 s: no health record for 11 s, stall_seconds 4. The old watcher stopped this job. Each
    SPARSE_HEALTH case is its own job; they run and are watched side by side."""
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    triggers = []
    for case, health in SPARSE_HEALTH.items():
        config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / case), "epochs": 1,
                  "health": health | {"stall_seconds": 4},
                  "faults": [{"kind": "slow_rank", "rank": 1, "step": 1, "seconds": 0.5}]}
        backend.launch(JobSpec(name=f"rf-slow-steps-{case}", config=config, num_workers=2))
        trigger = make_trigger(tmp_path, job_id=f"rf-slow-steps-{case}", health=config["health"])
        trigger.run_uri = config["run_uri"]
        triggers.append(trigger)
    for case, (got,) in zip(SPARSE_HEALTH, events_side_by_side(*triggers)):
        assert got["status"] == "success" and decided(got).exit_code == 0, (case, got)
        assert got["verdict"] is None or got["verdict"]["status"] != "STALLED", (case, got)


@pytest.mark.job
@pytest.mark.background  # waits out stall_seconds: beside the main lane (scripts/test.sh)
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
    backend.delete("rf-try-1")  # as the operator does on the policy's word
    del config["faults"]
    backend.launch(JobSpec(name="rf-try-2", config=config, num_workers=2))
    (second,) = events(make_trigger(tmp_path, job_id="rf-try-2", health=config["health"]))
    assert second["status"] == "success", second
    assert decided(second).verdict.status == "HEALTHY" and second["attempt"] != first["attempt"]
    result = RunResult.from_json(second["result"])
    assert result.succeeded and result.resumed_from == "ckpt-000000010" and result.attempt == second["attempt"]
