"""The training trigger: plain-JSON serialization, one event per run, never raising."""
import asyncio
import json

import pytest

from ringflow.operators.backends.local import LocalProcessBackend
from ringflow.operators.job_spec import JobSpec
from ringflow.operators.trigger import HorovodJobTrigger


def make_trigger(tmp_path, job_id="rf-x", **kwargs):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    return HorovodJobTrigger(backend_kind="local", backend_kwargs=backend.to_dict(), job_id=job_id,
                             run_uri=str(tmp_path / "run"), poll_interval=0.2, **kwargs)


def events(trigger):
    async def collect():
        return [event.payload async for event in trigger.run()]
    return asyncio.run(collect())


def test_serialization_round_trip(tmp_path):
    trigger = make_trigger(tmp_path, health={"stall_seconds": 30}, timeout_at=123.0, log_cursor=42)
    classpath, kwargs = trigger.serialize()
    assert classpath == "ringflow.operators.trigger.HorovodJobTrigger"
    kwargs = json.loads(json.dumps(kwargs))  # plain JSON, nothing else
    rebuilt = HorovodJobTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_unknown_job_yields_one_error_event_instead_of_raising(tmp_path):
    (got,) = events(make_trigger(tmp_path, job_id="rf-missing"))
    assert got["status"] == "error" and "rf-missing" in got["message"]


@pytest.mark.slow
def test_success_and_fatal_verdict(tmp_path, digits_manifest):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
    config = {"manifest_uri": digits_manifest, "checkpoint": {"uri": str(tmp_path / "run")}, "epochs": 1}
    backend.launch(JobSpec(name="rf-good", config=config, num_workers=2))
    (ok,) = events(make_trigger(tmp_path, job_id="rf-good"))
    assert ok["status"] == "success" and ok["state"] == "succeeded" and ok["exit_code"] == 0

    config = config | {"checkpoint": {"uri": str(tmp_path / "run2")}, "epochs": 3,
                       "faults": [{"kind": "nan_gradient", "rank": 1, "step": 4}]}
    backend.launch(JobSpec(name="rf-nan", config=config, num_workers=2))
    trigger = make_trigger(tmp_path, job_id="rf-nan")
    trigger.run_uri = str(tmp_path / "run2")
    (bad,) = events(trigger)
    assert bad["status"] == "error" and bad["verdict"]["status"] == "NONFINITE"
    assert bad["verdict"]["evidence"]["ranks"] == [1]


@pytest.mark.slow
def test_timeout_stops_the_job(tmp_path, digits_manifest):
    import time

    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2)
    config = {"manifest_uri": digits_manifest, "checkpoint": {"uri": str(tmp_path / "run")}, "epochs": 1,
              "faults": [{"kind": "hang", "rank": 0, "step": 2}]}
    backend.launch(JobSpec(name="rf-slow", config=config, num_workers=2))
    (got,) = events(make_trigger(tmp_path, job_id="rf-slow", timeout_at=time.time() + 8))
    assert got["status"] == "timeout"
    assert backend.status("rf-slow").finished
