"""outcome_from_status over a table of MPIJob statuses and pods, as the MPI Operator v0.8.2 and the kubelet
report them."""
from __future__ import annotations

import pytest

from ringflow.training.core.backends.base import JobState
from ringflow.training.core.backends.kubernetes.mpijob_outcome import outcome_from_status, quantity_bytes

PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED = JobState

IMAGE = "registry.example/ringflow-training:0.1.0"


def job(*conds):
    """An MPIJob whose status has these (type, reason, message) conditions set True."""
    return {"metadata": {"name": "j"}, "status": {"conditions": [
        {"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conds]}}


CREATED = ("Created", "MPIJobCreated", "MPIJob default/j is created.")
RUNNING_C = ("Running", "MPIJobRunning", "MPIJob default/j is running.")
SUCCEEDED_C = ("Succeeded", "MPIJobSucceeded", "MPIJob default/j successfully completed.")


def pod(role, i=0, phase="Running", *, state=None, last=None, restarts=0, ready=True, reason=None, message=None,
        created="2030-01-01T00:00:00Z"):
    status = {"phase": phase, "containerStatuses": [{
        "name": role, "image": IMAGE, "restartCount": restarts, "state": state or {"running": {}},
        **({"lastState": {"terminated": last}} if last else {})}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    name = f"j-launcher-{i}" if role == "launcher" else f"j-worker-{i}"
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "labels": {"training.kubeflow.org/job-name": "j", "training.kubeflow.org/job-role": role}},
            "spec": {"containers": [{"name": role, "image": IMAGE, "resources": {"limits": {"memory": "2Gi"}}}]},
            "status": status}


def terminated(reason, code, message=""):
    return {"terminated": {"reason": reason, "exitCode": code, "message": message}}


OOM = {"reason": "OOMKilled", "exitCode": 137}
SSH_ERROR = ("ssh: Could not resolve hostname j-worker-1.j.default.svc: Name or service not known\n"
             "ORTE was unable to reliably start one or more daemons.")

CASES = [
    # (id, mpijob, pods, state, words in the reason, exit code)
    ("just created", job(CREATED), [], PENDING, ["waiting for the MPI Operator to start the job"], None),
    ("workers not ready yet", job(CREATED), [pod("worker", 0, ready=False), pod("worker", 1)], PENDING,
     ["waiting for workers to be Ready: j-worker-0"], None),
    ("running", job(CREATED, RUNNING_C), [pod("launcher"), pod("worker", 0), pod("worker", 1)], RUNNING, [], None),
    ("succeeded", job(CREATED, SUCCEEDED_C),
     [pod("launcher", phase="Succeeded", state=terminated("Completed", 0))], SUCCEEDED, ["completed"], 0),
    ("failed, operator reason only", job(CREATED, ("Failed", "BackoffLimitExceeded/Error",
                                                   "Job has reached the specified backoff limit: exit code 3")),
     [pod("launcher", phase="Failed", state=terminated("Error", 3, "Traceback ...\nValueError: bad config"))],
     FAILED, ["BackoffLimitExceeded", "backoff limit"], 3),
    ("failed, worker OOMKilled", job(CREATED, ("Failed", "BackoffLimitExceeded/Error", "exit code 1")),
     [pod("launcher", phase="Failed", state=terminated("Error", 1)), pod("worker", 0),
      pod("worker", 1, state={"waiting": {"reason": "CrashLoopBackOff"}}, last=OOM, restarts=1, ready=False)],
     FAILED, ["j-worker-1", "OOMKilled", "batch size", "2Gi", "BackoffLimitExceeded"], 1),
    ("worker OOMKilled for good before the operator noticed", job(CREATED, RUNNING_C),
     [pod("launcher"), pod("worker", 0), pod("worker", 1, phase="Failed", state={"terminated": OOM}, ready=False)],
     FAILED, ["j-worker-1", "OOMKilled", "batch size"], None),
    ("worker OOMKilled and restarting", job(CREATED, RUNNING_C),
     [pod("launcher"), pod("worker", 0),
      pod("worker", 1, state={"waiting": {"reason": "CrashLoopBackOff"}}, last=OOM, restarts=1, ready=False)],
     RESTARTING, ["j-worker-1", "OOMKilled", "batch size"], None),
    ("evicted worker", job(CREATED, ("Failed", "MPIJobEvicted", "1/2 workers are evicted")),
     [pod("launcher"), pod("worker", 0, phase="Failed", reason="Evicted",
                           message="The node was low on resource: memory.", state=terminated("Error", 137))],
     FAILED, ["j-worker-0", "evicted", "low on resource"], None),
    ("image cannot be pulled: wrong tag", job(CREATED),
     [pod("worker", 0, phase="Pending", ready=False, state={"waiting": {
         "reason": "ErrImagePull", "message": f'failed to pull "{IMAGE}": manifest unknown'}})],
     FAILED, [IMAGE, "ErrImagePull", "tag"], None),
    ("image pull backing off, maybe transient", job(CREATED),
     [pod("worker", 0, phase="Pending", ready=False, state={"waiting": {
         "reason": "ImagePullBackOff", "message": "Back-off pulling image; i/o timeout"}})],
     PENDING, [IMAGE, "ImagePullBackOff"], None),
    ("launcher cannot reach workers, retrying", job(CREATED),
     [pod("launcher", 0, phase="Failed", state=terminated("Error", 1, SSH_ERROR), created="2030-01-01T00:00:00Z"),
      pod("launcher", 1, phase="Pending", state={"waiting": {"reason": "ContainerCreating"}},
          created="2030-01-01T00:01:00Z"),
      pod("worker", 0), pod("worker", 1, ready=False)],
     RESTARTING, ["could not reach the workers", "Could not resolve hostname"], None),
    ("launcher cannot reach workers, gave up", job(CREATED, ("Failed", "BackoffLimitExceeded/Error", "")),
     [pod("launcher", 0, phase="Failed", state=terminated("Error", 1, SSH_ERROR))],
     FAILED, ["could not reach the workers", "ORTE was unable"], 1),
    ("launcher failed while a worker was not ready", job(CREATED, ("Failed", "BackoffLimitExceeded", "")),
     [pod("launcher", phase="Failed", state=terminated("Error", 1)), pod("worker", 0, ready=False)],
     FAILED, ["the launcher failed while workers j-worker-0 were not Ready; check the worker pods' events",
              "MPIJob failed: BackoffLimitExceeded", "launcher exit code 1"], 1),
    ("launcher restarted in place, running again", job(CREATED, RUNNING_C),
     [pod("launcher", restarts=1, last={"reason": "Error", "exitCode": 1}), pod("worker", 0)], RUNNING, [], None),
    ("launcher in CrashLoopBackOff", job(CREATED, RUNNING_C),
     [pod("launcher", restarts=2, state={"waiting": {"reason": "CrashLoopBackOff"}},
          last={"reason": "Error", "exitCode": 1}), pod("worker", 0)],
     RESTARTING, ["retried"], None),
    ("secret missing", job(CREATED),
     [pod("launcher", phase="Pending", ready=False, state={"waiting": {
         "reason": "CreateContainerConfigError", "message": 'secret "ringflow-minio" not found'}})],
     PENDING, ["ringflow-minio", "s3_secret_name"], None),
    ("suspended", job(CREATED, ("Suspended", "MPIJobSuspended", "MPIJob suspended")), [], PENDING,
     ["the MPIJob is suspended"], None),
    ("no status at all", {"metadata": {"name": "j"}}, [], PENDING, [], None),
]


@pytest.mark.parametrize("mpijob, pods, state, words, exit_code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_outcome(mpijob, pods, state, words, exit_code):
    status = outcome_from_status(mpijob, pods)
    assert status.state == state, status
    for word in words:
        assert word.lower() in status.reason.lower(), (word, status.reason)
    assert status.exit_code == exit_code
    assert set(status.detail["pods"]) == {p["metadata"]["name"] for p in pods}


def test_detail_names_the_pod_and_problem():
    status = outcome_from_status(job(CREATED, RUNNING_C), [pod("worker", 1, phase="Failed", state={"terminated": OOM})])
    assert status.detail["problem"] == "oom_killed" and status.detail["pod"] == "j-worker-1"
    assert status.finished


@pytest.mark.parametrize("case", ["failed, worker OOMKilled", "worker OOMKilled for good before the operator noticed"])
def test_an_oom_killed_worker_is_the_oom_verdict(case):
    """The same verdict a rank's own OOM gets (health/oom.py): the rank (the worker's index: one rank per
    worker pod), the pod's memory limit, the advice in words (the job's config is not the pods')."""
    mpijob, pods = next(c[1:3] for c in CASES if c[0] == case)
    verdict = outcome_from_status(mpijob, pods).verdict
    assert verdict.status == "OOM" and verdict.evidence["kind"] == "kubernetes_oomkilled"
    assert verdict.evidence["rank"] == 1 and verdict.evidence["limit_bytes"] == 2 * 2**30
    assert verdict.evidence["step"] is None  # the trigger adds rank 0's (test_mpijob_backend.py)
    assert [a["option"] for a in verdict.evidence["advice"]] == ["accumulate", "smaller_model", "more_workers",
                                                                  "more_memory"]


def test_other_failures_carry_no_verdict():
    assert all(outcome_from_status(c[1], c[2]).verdict is None for c in CASES if "OOMKilled" not in c[0])


@pytest.mark.parametrize("quantity, expected", [("2Gi", 2 * 2**30), ("512Mi", 512 * 2**20), ("1G", 10**9),
                                                ("1073741824", 2**30), ("1.5Gi", 3 * 2**29), ("100m", None),
                                                ("lots", None)])
def test_quantity_bytes(quantity, expected):
    assert quantity_bytes(quantity) == expected
