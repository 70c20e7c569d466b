"""The train operator: builds a checked config, launches through the backend, defers; on_kill stops the job."""
import types

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from ringflow.operators.backends.local import LocalProcessBackend
from ringflow.operators.train import HorovodTrainOperator, job_name, merge
from ringflow.operators.trigger import HorovodJobTrigger
from ringflow.training.config import ConfigError


def context(try_number=1):
    return {"ti": types.SimpleNamespace(dag_id="ringflow_retrain", run_id="manual__2026-11-30T00:00:00+00:00",
                                        task_id="train", try_number=try_number)}


def operator(tmp_path, manifest, **kwargs):
    return HorovodTrainOperator(task_id="train", manifest_uri=manifest, run_uri=str(tmp_path / "run"),
                                backend=LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2),
                                **kwargs)


def test_job_names_are_dns_labels_unique_per_try():
    a = job_name("My_DAG", "manual__2026-11-30T00:00:00+00:00", "train", 1)
    assert a.startswith("rf-my-dag-train-") and a.endswith("-t1") and len(a) <= 63
    assert job_name("My_DAG", "manual__2026-11-30T00:00:00+00:00", "train", 2) != a
    assert job_name("x" * 300, "r", "t", 1).count("-") >= 2 and len(job_name("x" * 300, "r", "t", 1)) <= 63


def test_merge_is_deep():
    assert merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}, "d": 1}


def test_bad_config_fails_before_launch(tmp_path, digits_manifest):
    op = operator(tmp_path, digits_manifest, job_config={"batch_size": 0})
    with pytest.raises(ConfigError, match="batch_size"):
        op.execute(context())
    assert not (tmp_path / "jobs").exists()


def test_worker_count_must_match_shards(tmp_path, digits_manifest):
    with pytest.raises(AirflowException, match="2 partitions but the job asks for 3"):
        operator(tmp_path, digits_manifest, num_workers=3).execute(context())


@pytest.mark.slow
def test_defers_reattaches_and_on_kill_stops_the_job(tmp_path, digits_manifest):
    op = operator(tmp_path, digits_manifest, job_config={"faults": [{"kind": "hang", "rank": 0, "step": 1}]})
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, HorovodJobTrigger) and deferred.value.method_name == "execute_complete"
    job_id = trigger.job_id
    backend = op.backend
    assert backend.status(job_id).state == "running"

    retry = operator(tmp_path, digits_manifest)
    with pytest.raises(TaskDeferred) as again:
        retry.execute(context(try_number=2))
    assert again.value.trigger.job_id == job_id  # reattached, not a second job

    op.on_kill()
    assert backend.status(job_id).finished


def test_execute_complete_turns_errors_into_failures(tmp_path, digits_manifest):
    op = operator(tmp_path, digits_manifest)
    event = {"status": "error", "message": "stopped job rf-1: health verdict NONFINITE: NaN/Inf in rank(s) [1]",
             "verdict": {"status": "NONFINITE", "evidence": {"step": 4, "ranks": [1]}}}
    with pytest.raises(AirflowFailException, match=r"NONFINITE.*evidence.*\"ranks\": \[1\]"):
        op.execute_complete(context(), event)  # not retried: a retry would meet the same NaN
    stalled = {"status": "error", "message": "stopped job rf-1: health verdict STALLED",
               "verdict": {"status": "STALLED", "evidence": {"rank": 1}}}
    with pytest.raises(AirflowException) as err:
        op.execute_complete(context(), stalled)
    assert not isinstance(err.value, AirflowFailException)  # a hang may pass: retry from the checkpoint
