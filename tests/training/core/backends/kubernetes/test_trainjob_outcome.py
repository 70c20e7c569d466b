"""outcome_from_trainjob over a table of TrainJob statuses and JobSet pods, as Kubeflow Trainer v2.3.0, the
JobSet controller and the kubelet report them; the messages are the MPIJob backend's (test_mpijob_outcome)."""
from __future__ import annotations

import pytest

from ringflow.training.core.backends.base import JobState
from ringflow.training.core.backends.kubernetes.trainjob_outcome import outcome_from_trainjob

PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED = JobState

IMAGE = "registry.example/ringflow-training:0.1.0"


def job(engine="horovod", *conds, nodes=2):
    """A TrainJob whose status has these (type, reason, message) conditions set True."""
    return {"metadata": {"name": "j", "annotations": {"ringflow/engine": engine}},
            "spec": {"trainer": {"numNodes": nodes}},
            "status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conds]}}


COMPLETE = ("Complete", "AllJobsCompleted", "jobset completed successfully")
BACKOFF = ("Failed", "FailedJobs", "jobset failed due to reaching max number of restarts")


def pod(rjob, i=0, phase="Running", *, state=None, last=None, restarts=0, ready=True, reason=None, message=None,
        attempt=0, created="2030-01-01T00:00:00Z", name=None):
    status = {"phase": phase, "containerStatuses": [{
        "name": "node", "image": IMAGE, "restartCount": restarts, "state": state or {"running": {}},
        **({"lastState": {"terminated": last}} if last else {})}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return {"metadata": {"name": name or f"j-{rjob}-0-{i}-a{attempt}", "creationTimestamp": created, "labels": {
                "jobset.sigs.k8s.io/jobset-name": "j", "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                "jobset.sigs.k8s.io/restart-attempt": str(attempt), "batch.kubernetes.io/job-completion-index": str(i)}},
            "spec": {"containers": [{"name": "node", "image": IMAGE, "resources": {"limits": {"memory": "2Gi"}}}]},
            "status": status}


def terminated(reason, code, message=""):
    return {"terminated": {"reason": reason, "exitCode": code, "message": message}}


def failed(rjob, i=0, code=1, message="", reason="Error", **kw):
    return pod(rjob, i, "Failed", state=terminated(reason, code, message), ready=False, **kw)


SSH_ERROR = ("ssh: Could not resolve hostname j-node-0-1.j: Name or service not known\n"
             "ORTE was unable to reliably start one or more daemons.")
TORCH_ERROR = ("torch.distributed.DistNetworkError: The client socket has timed out after 900s while trying to "
               "connect to (j-node-0-0.j, 29500).")
TF_ERROR = ("tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: failed to "
            "connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.7:29500: Failed to connect to remote host: "
            "Connection refused")
PULL_WAITING = {"waiting": {"reason": "ErrImagePull", "message": "manifest unknown: tag 0.1.0 not found"}}
HOROVOD_UP = [pod("launcher"), pod("node")]
DDP_UP = [pod("node", 0), pod("node", 1)]

CASES = [
    # (id, trainjob, pods, state, words in the reason, exit code)
    ("horovod: no pods yet", job(), [], PENDING, ["waiting for Kubeflow Trainer to start the job's pods"], None),
    ("horovod: nodes not ready, launcher waits", job(), [pod("node", ready=False, phase="Pending",
                                                             state={"waiting": {"reason": "ContainerCreating"}})],
     PENDING, ["waiting for nodes to be Ready: j-node-0-0-a0"], None),
    ("horovod: launcher runs", job(), HOROVOD_UP, RUNNING, [], None),
    ("ddp: one node still pending", job("ddp"), [pod("node", 0), pod("node", 1, "Pending", ready=False)], PENDING,
     ["j-node-0-1-a0"], None),
    ("ddp: every torchrun runs", job("ddp"), DDP_UP, RUNNING, [], None),
    ("launcher done, Complete not set yet", job(), [pod("launcher", phase="Succeeded",
                                                        state=terminated("Completed", 0)), pod("node")],
     RUNNING, [], None),
    ("complete", job("horovod", COMPLETE), [pod("launcher", phase="Succeeded", state=terminated("Completed", 0))],
     SUCCEEDED, ["completed"], 0),
    ("failed, Trainer's reason only", job("horovod", BACKOFF),
     [failed("launcher", code=3, message="Traceback ...\nValueError: bad config"), pod("node")],
     FAILED, ["TrainJob failed", "FailedJobs", "max number of restarts", "launcher exit code 3"], 3),
    ("deadline exceeded", job("ddp", ("Failed", "DeadlineExceeded", "TrainJob exceeded its deadline")), [],
     FAILED, ["DeadlineExceeded", "deadline"], None),
    ("OOM-killed node, with batch-size advice", job(), [pod("launcher"), failed("node", code=137, reason="OOMKilled")],
     FAILED, ["j-node-0-0-a0", "OOMKilled", "memory limit 2Gi", "batch size"], None),  # mpirun still runs
    ("OOM in a failed ddp job", job("ddp", BACKOFF), [failed("node", 1, code=137, reason="OOMKilled"), pod("node", 0)],
     FAILED, ["node j-node-0-1-a0 was OOMKilled", "batch size", "FailedJobs"], 137),
    # A real JobSet pod's name ends in a random suffix, here all digits: the rank is its completion index.
    ("OOM-killed tensorflow worker: its rank from the completion index", job("tensorflow", BACKOFF),
     [failed("node", 1, code=137, reason="OOMKilled", name="j-node-0-1-40213"), pod("node", 0)],
     FAILED, ["rank 1 ran out of memory", "node j-node-0-1-40213 was OOMKilled", "FailedJobs"], 137),
    ("OOM-killed ddp node 0 named like index 7", job("ddp", BACKOFF),
     [failed("node", 0, code=137, reason="OOMKilled", name="j-node-0-0-7"), pod("node", 1)],
     FAILED, ["rank 0 ran out of memory", "j-node-0-0-7 was OOMKilled"], 137),
    ("evicted", job(), [pod("launcher"), pod("node", phase="Failed", reason="Evicted",
                                             message="The node was low on resource: memory.")],
     FAILED, ["evicted", "low on resource", "requests"], None),
    ("image cannot be pulled", job("ddp"), [pod("node", 0, "Pending", state=PULL_WAITING, ready=False)],
     FAILED, ["cannot pull image", IMAGE, "image_pull_secrets"], None),
    ("launcher cannot reach the nodes: the JobSet restarts", job(),
     [failed("launcher", code=1, message=SSH_ERROR), pod("node")],
     RESTARTING, ["launcher j-launcher-0-0-a0 could not reach the workers", "ORTE was unable", "sshd",
                  "NetworkPolicy"], None),
    ("ddp rank cannot reach node 0, finally failed", job("ddp", BACKOFF),
     [failed("node", 1, code=1, message=TORCH_ERROR, attempt=1), pod("node", 0, attempt=1)],
     FAILED, ["node j-node-0-1-a1 could not reach the other ranks", "DistNetworkError", "port 29500",
              "NetworkPolicy", "rank exit code 1"], 1),
    ("tensorflow: one worker still pending", job("tensorflow"), [pod("node", 0), pod("node", 1, "Pending", ready=False)],
     PENDING, ["j-node-0-1-a0"], None),
    ("tensorflow: every worker runs", job("tensorflow"), DDP_UP, RUNNING, [], None),
    ("tensorflow worker cannot reach the others, finally failed", job("tensorflow", BACKOFF),
     [failed("node", 1, code=1, message=TF_ERROR, attempt=1), pod("node", 0, attempt=1)],
     FAILED, ["node j-node-0-1-a1 could not reach the other ranks", "UnavailableError", "port 29500",
              "TF_CONFIG", "NetworkPolicy", "rank exit code 1"], 1),
    ("tensorflow pod without its runtime's env", job("tensorflow", BACKOFF),
     [failed("node", 0, code=2, message="[ringflow] cannot derive TF_CONFIG: $RINGFLOW_JOBSET_NAME is empty")],
     FAILED, ["TrainJob failed", "exit code 2"], 2),
    ("ddp failed while nodes of this attempt were not ready", job("ddp", BACKOFF),
     [failed("node", 0, code=1, attempt=1), pod("node", 1, "Pending", ready=False, attempt=1),
      pod("node", 1, ready=False, attempt=0)],
     FAILED, ["the job failed while nodes j-node-0-0-a1, j-node-0-1-a1 were not Ready; check the node pods' events",
              "TrainJob failed: FailedJobs", "rank exit code 1"], 1),
    ("new attempt starting after a restart", job(),
     [failed("launcher", code=1), pod("launcher", phase="Pending", ready=False, attempt=1,
                                      state={"waiting": {"reason": "ContainerCreating"}}), pod("node", attempt=1)],
     RESTARTING, ["restart 1"], None),
    ("new attempt running", job(), [failed("launcher", code=1), pod("launcher", attempt=1), pod("node", attempt=1)],
     RUNNING, [], None),
    ("suspended (e.g. queued by Kueue)", job("horovod", ("Suspended", "Suspended", "TrainJob is suspended")), [],
     PENDING, ["the TrainJob is suspended"], None),
    ("secret missing", job("ddp"), [pod("node", 0, "Pending", ready=False, state={"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "ringflow-minio" not found'}})],
     PENDING, ["ringflow-minio", "s3_secret_name"], None),
]


@pytest.mark.parametrize("trainjob, pods, state, words, exit_code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_outcome(trainjob, pods, state, words, exit_code):
    status = outcome_from_trainjob(trainjob, pods)
    assert status.state == state, status
    for word in words:
        assert word in status.reason, f"{word!r} not in {status.reason!r}"
    assert status.exit_code == exit_code
    assert set(status.detail["pods"]) == {p["metadata"]["name"] for p in pods}


def test_restarts_and_problem_are_in_the_detail():
    status = outcome_from_trainjob(job(), [failed("launcher", code=1, message=SSH_ERROR), pod("launcher", attempt=1)])
    assert status.detail["restarts"] == 1 and status.detail["problem"] == "unreachable_workers"
    assert status.detail["pod"] == "j-launcher-0-0-a0"
