"""What both Kubernetes backends (MPIJob and TrainJob) must do alike against the API emulator (kmock_cluster).

Each check takes the job kind's resource ("kubeflow.org/v2beta1/mpijobs") and kind ("MPIJob"), so that the
test files keep only what differs between the two."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import kmock
import pytest

from kmock_cluster import CONFIGMAPS
from ringflow.training.backends.base import JobNotFound
from ringflow.training.backends.kubernetes.client import AlreadyExistsError

NS = "training"
LABELS = {"dag": "retrain", "run": "scheduled__2030-01-01T00:00:00+00:00", "task": "train", "try": "1"}


def assert_logs_follow_the_pod(cluster, backend, job_id: str, pod: str) -> Any:
    """The log comes in whole lines, and the cursor (through JSON) picks up where the last read stopped.
    Returns the second chunk."""
    cluster.logs[(NS, pod)] = "[1,0]<stdout>:epoch 1 loss 0.9\n[1,1]<stdout>:epoch 1 loss 0.8\n[1,0]<stdout>:ep"
    first = backend.logs(job_id)
    assert first.lines == ["[1,0]<stdout>:epoch 1 loss 0.9", "[1,1]<stdout>:epoch 1 loss 0.8"]
    cluster.logs[(NS, pod)] += "och 2 loss 0.5\ndone\n"
    second = backend.logs(job_id, json.loads(json.dumps(first.next_cursor)))  # cursors survive JSON
    assert second.lines == ["[1,0]<stdout>:epoch 2 loss 0.5", "done"]
    return second


def assert_delete_is_foreground_and_tolerates_404(cluster, backend, job_id: str, resource: str, kind: str) -> None:
    backend.delete(job_id)
    assert cluster.get(resource, NS, job_id) is None and cluster.get(CONFIGMAPS, NS, f"{job_id}-ringflow") is None
    plural = resource.rsplit("/", 1)[-1]
    deletes = [r for r in cluster.requests("delete") if f"/{plural}/" in r.url.path]
    assert deletes and deletes[0].data == {"propagationPolicy": "Foreground"}
    backend.delete(job_id)  # already gone: not an error
    asyncio.run(backend.adelete(job_id))
    with pytest.raises(JobNotFound, match=f"no {kind} {NS}/{job_id}"):
        backend.status(job_id)
    with pytest.raises(JobNotFound):
        asyncio.run(backend.astatus(job_id))


def assert_a_foreign_object_is_left_alone(cluster, backend, spec, resource: str, kind: str) -> None:
    """A job of that name that someone else created: launching fails, and their object stays as it was."""
    cluster.put(resource, NS, spec.name, {"apiVersion": resource.rsplit("/", 1)[0], "kind": kind,
                                          "metadata": {"labels": {"app": "someone-else"}}, "spec": {}})
    with pytest.raises(AlreadyExistsError, match="already exists.*labels differ"):
        backend.launch(spec)
    assert cluster.get(resource, NS, spec.name)["metadata"]["labels"] == {"app": "someone-else"}
    assert cluster.get(CONFIGMAPS, NS, f"{spec.name}-ringflow") is None


def assert_a_failed_configmap_create_removes_the_job(cluster, backend, spec, resource: str) -> None:
    cluster.k["post", kmock.resource(CONFIGMAPS)] << 403 << {"kind": "Status", "code": 403, "reason": "Forbidden",
                                                            "message": "configmaps is forbidden"}
    with pytest.raises(Exception, match="forbidden"):
        backend.launch(spec)
    assert cluster.get(resource, NS, spec.name) is None
