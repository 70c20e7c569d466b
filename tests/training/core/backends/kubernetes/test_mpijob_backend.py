"""MPIJobBackend end to end against a Kubernetes API emulator (kmock on 127.0.0.1), through the real
`kubernetes` and `kubernetes_asyncio` clients. The tests play the MPI Operator: they write the MPIJob's
status conditions and the pods it would create."""
from __future__ import annotations

import asyncio
import json

import kmock
import pytest

import backend_checks as checks
import strict_schema
from backend_checks import LABELS, NS
from kmock_cluster import CONFIGMAPS, MPIJOBS
from ringflow.training.core.backends.base import JobState, backend_from_dict
from ringflow.training.core.backends.job_spec import JobSpec, JobSpecError

PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED = JobState

pytestmark = pytest.mark.job


def spec(name="retrain-1", **kw):
    return JobSpec(**(dict(name=name, config={"epochs": 2}, num_workers=2, labels=LABELS) | kw))


def running(restarts=0):
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "c", "restartCount": restarts, "state": {"running": {}}}]}


def test_runs_and_succeeds(cluster, backend):
    job_id = backend.launch(spec())
    assert job_id == "retrain-1"
    submitted = cluster.get(MPIJOBS, NS, job_id)
    strict_schema.assert_valid({k: v for k, v in submitted.items()})
    # The ConfigMap holds the config and is owned by the MPIJob, so deleting the job removes it.
    cm = cluster.get(CONFIGMAPS, NS, "retrain-1-ringflow")
    assert json.loads(cm["data"]["job.json"]) == {"epochs": 2}
    assert cm["metadata"]["ownerReferences"] == [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                                  "name": job_id, "uid": submitted["metadata"]["uid"]}]
    assert backend.status(job_id).state == PENDING

    cluster.set_conditions(NS, job_id, ("Created", "MPIJobCreated", "created"))
    for i in range(2):
        cluster.add_pod(NS, job_id, "worker", i, status=running())
    launcher = cluster.add_pod(NS, job_id, "launcher", status=running())
    cluster.set_conditions(NS, job_id, ("Created", "MPIJobCreated", "created"), ("Running", "MPIJobRunning", "running"))
    assert backend.status(job_id).state == RUNNING

    second = checks.assert_logs_follow_the_pod(cluster, backend, job_id, launcher)
    assert backend.logs(job_id, second.next_cursor).lines == []

    cluster.set_conditions(NS, job_id, ("Created", "MPIJobCreated", "created"),
                           ("Succeeded", "MPIJobSucceeded", f"MPIJob {NS}/{job_id} successfully completed."))
    status = backend.status(job_id)
    assert status.state == SUCCEEDED and status.exit_code == 0
    assert backend.find({"dag": "retrain", "run": LABELS["run"]}) is None  # finished: nothing to reattach to


def test_fails_with_a_reason(cluster, backend):
    job_id = backend.launch(spec())
    launcher = cluster.add_pod(NS, job_id, "launcher", status={"phase": "Failed", "containerStatuses": [{
        "name": "launcher", "restartCount": 0,
        "state": {"terminated": {"reason": "Error", "exitCode": 2,
                                 "message": "ringflow: config error: unknown model 'mlpp'"}}}]})
    cluster.set_conditions(NS, job_id, ("Created", "MPIJobCreated", ""),
                           ("Failed", "BackoffLimitExceeded/Error", "Job has reached the specified backoff limit"))
    status = backend.status(job_id)
    assert status.state == FAILED and status.exit_code == 2
    assert "BackoffLimitExceeded" in status.reason and "backoff limit" in status.reason
    assert launcher in status.detail["pods"]


def test_oom_killed_worker_is_named(cluster, backend):
    job_id = backend.launch(spec())
    cluster.add_pod(NS, job_id, "launcher", status=running())
    cluster.add_pod(NS, job_id, "worker", 0, status=running())
    cluster.add_pod(NS, job_id, "worker", 1, status={"phase": "Failed", "containerStatuses": [{
        "name": "worker", "restartCount": 0, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]})
    status = asyncio.run(backend.astatus(job_id))  # the trigger's path
    assert status.state == FAILED
    assert "retrain-1-worker-1" in status.reason and "OOMKilled" in status.reason and "batch size" in status.reason
    assert status.verdict.status == "OOM" and status.verdict.evidence["rank"] == 1


def test_the_trigger_reports_an_oom_killed_worker_as_the_oom_verdict(cluster, backend, tmp_path):
    """The trigger's one event over the same emulator: the OOM verdict from the pod, with the step rank 0's
    heartbeat shows; the operator's policy fails the task without a retry, with exit code 9."""
    from ringflow.operators.trigger import TrainJobTrigger
    from ringflow.training.core.failure_policy import Action, Observation, decide
    from ringflow.training.health.heartbeat import Heartbeat
    from ringflow.training.store import LocalFolderStore

    job_id = backend.launch(spec())
    run = tmp_path / "run"
    LocalFolderStore(str(run)).put_bytes("heartbeat.json", Heartbeat("a1", 5, 0.0, 41, 0.1, 0.0).to_json())
    cluster.add_pod(NS, job_id, "launcher", status=running())
    cluster.add_pod(NS, job_id, "worker", 0, status=running())
    cluster.add_pod(NS, job_id, "worker", 1, status={"phase": "Failed", "containerStatuses": [{
        "name": "worker", "restartCount": 0, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]})
    trigger = TrainJobTrigger(backend_kind="mpijob", backend_kwargs=backend.to_dict(), job_id=job_id,
                              run_uri=str(run), poll_interval=0.05, attempt="a1")

    async def one_event():
        return [event.payload async for event in trigger.run()]

    (event,) = asyncio.run(one_event())
    assert event["status"] == "error" and event["verdict"]["status"] == "OOM", event
    assert event["verdict"]["evidence"]["rank"] == 1 and event["verdict"]["evidence"]["step"] == 42
    assert "rank 1 ran out of memory at step 42" in event["message"]
    decision = decide(Observation.from_dict(json.loads(json.dumps(event))))
    assert decision.action == Action.FAIL and decision.exit_code == 9


def test_delete_on_kill_is_foreground_and_tolerates_404(cluster, backend):
    checks.assert_delete_is_foreground_and_tolerates_404(cluster, backend, backend.launch(spec()), MPIJOBS, "MPIJob")


def mpijob_pods(cluster, job_id):
    """The launcher and both workers, running, as the MPI Operator makes them."""
    return [cluster.add_pod(NS, job_id, "launcher", status=checks.RUNNING_POD)] + [
        cluster.add_pod(NS, job_id, "worker", i, status=checks.RUNNING_POD) for i in (0, 1)]


def test_delete_waits_until_the_mpijob_and_its_pods_are_gone(cluster, backend):
    checks.assert_delete_waits_until_the_job_and_its_pods_are_gone(
        cluster, backend, spec(), lambda job_id: mpijob_pods(cluster, job_id), MPIJOBS, "MPIJob")


def test_async_delete(cluster, backend):
    job_id = backend.launch(spec())
    asyncio.run(backend.adelete(job_id))
    assert cluster.get(MPIJOBS, NS, job_id) is None and cluster.get(CONFIGMAPS, NS, "retrain-1-ringflow") is None


def test_reattach_via_find_on_retry(cluster, backend, settings_dict):
    job_id = backend.launch(spec())
    backend.launch(spec(name="other-run", labels=LABELS | {"run": "manual__2030-01-02"}))
    # Try 2 of the same task, in a fresh process (the backend rebuilt from JSON), looks for try 1's job.
    again = backend_from_dict("mpijob", json.loads(json.dumps(backend.to_dict())))
    assert again.find({"dag": "retrain", "run": LABELS["run"], "task": "train"}) == job_id
    assert again.find(LABELS) == job_id
    assert again.find({"dag": "retrain", "run": "scheduled__2030-01-01T00:00:00+00:01"}) is None
    # Launching the same job again (a retry that did not look first) reattaches instead of failing.
    assert again.launch(spec()) == job_id
    cluster.set_conditions(NS, job_id, ("Failed", "MPIJobFailed", "gone wrong"))
    assert again.find(LABELS) is None


def test_create_conflict_with_a_foreign_object(cluster, backend):
    checks.assert_a_foreign_object_is_left_alone(cluster, backend, spec(), MPIJOBS, "MPIJob")


def test_ddp_engine_is_refused_before_anything_is_submitted(cluster, backend):
    with pytest.raises(JobSpecError, match="engine 'ddp' cannot run as an MPIJob"):
        backend.launch(spec(config={"epochs": 2, "engine": "ddp"}))
    assert cluster.get(MPIJOBS, NS, "retrain-1") is None
    assert cluster.get(CONFIGMAPS, NS, "retrain-1-ringflow") is None


def test_failed_configmap_create_removes_the_mpijob(cluster, backend):
    checks.assert_a_failed_configmap_create_removes_the_job(cluster, backend, spec(), MPIJOBS)


def test_retries_429_and_500(cluster, backend, caplog):
    caplog.set_level("WARNING")
    job_id = backend.launch(spec())
    get_job = cluster.k["get", kmock.resource(MPIJOBS)]
    # The first two reads fail: too many requests (with Retry-After), then a server error.
    get_job[:1] << 429 << cluster.k.headers({"Retry-After": "0"}) << {"kind": "Status", "code": 429}
    get_job[1:2] << 500 << {"kind": "Status", "code": 500, "message": "etcd hiccup"}
    assert backend.status(job_id).state == PENDING
    assert len(cluster.requests("get", MPIJOBS)) == 3
    assert "HTTP 429" in caplog.text and "HTTP 500" in caplog.text and "etcd hiccup" in caplog.text
    # The same through the async client.
    get_job[3:4] << 503 << {"kind": "Status", "code": 503}
    assert asyncio.run(backend.astatus(job_id)).state == PENDING
    assert "HTTP 503" in caplog.text


def test_lost_create_response_is_a_reattach(cluster, backend):
    # The server created the job but the answer was lost (500): the retry's 409 finds our own job.
    cluster.k["post", kmock.resource(MPIJOBS)][:1] << 500 << {"kind": "Status", "code": 500}
    assert backend.launch(spec()) == "retrain-1"
    assert len(cluster.requests("post", MPIJOBS)) == 2


def test_async_logs(cluster, backend):
    job_id = backend.launch(spec())
    assert asyncio.run(backend.alogs(job_id)).lines == []  # no launcher yet
    launcher = cluster.add_pod(NS, job_id, "launcher", status=running())
    assert asyncio.run(backend.alogs(job_id)).lines == []  # container not started: the API says 400
    cluster.logs[(NS, launcher)] = "a\nb\n"
    chunk = asyncio.run(backend.alogs(job_id))
    assert chunk.lines == ["a", "b"]
    # A retried launcher (new pod) starts a new log: read it from its start.
    newer = cluster.add_pod(NS, job_id, "launcher", 1, status=running(), created="2030-01-01T01:00:00Z")
    cluster.logs[(NS, newer)] = "retry 1\n"
    assert backend.logs(job_id, chunk.next_cursor).lines == ["retry 1"]
