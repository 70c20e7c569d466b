"""What both Kubernetes backends (MPIJob and TrainJob) must do alike against the API emulator (kmock_cluster).

Each check takes the job kind's resource ("kubeflow.org/v2beta1/mpijobs") and kind ("MPIJob"), so that the
test files keep only what differs between the two."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import kmock
import pytest

from kmock_cluster import CONFIGMAPS, PODS
from ringflow.training.core.backends.base import JobNotFound, backend_from_dict
from ringflow.training.core.backends.kubernetes.cluster_job import StillDeleting
from ringflow.training.core.backends.kubernetes.client import AlreadyExistsError

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


RUNNING_POD = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def left_of(cluster, resource: str, job_id: str, pods: list[str]) -> list[str]:
    """What of the job is still in the cluster: the job object and any of `pods`."""
    return ([resource] if cluster.get(resource, NS, job_id) else []) + [p for p in pods if cluster.get(PODS, NS, p)]


async def _launch_and_adelete(backend, spec, add_pods) -> list[str]:
    job_id = await asyncio.to_thread(backend.launch, spec)
    pods = add_pods(job_id)
    await backend.adelete(job_id)
    return pods


def assert_delete_waits_until_the_job_and_its_pods_are_gone(cluster, backend, spec, add_pods, resource: str,
                                                             kind: str) -> None:
    """The pods take a while to terminate (the emulator plays the API server's foreground deletion): delete
    and adelete come back only once the job object and every pod are gone; when the wait runs out (a pod
    that never terminates), the error names the job and the pods left. add_pods(job_id): the pods the job's
    operator would make, running; returns their names."""
    cluster.set_pod_termination(0.5)
    pods = add_pods(backend.launch(spec))
    assert left_of(cluster, resource, spec.name, pods) == [resource, *pods]
    backend.delete(spec.name)
    assert left_of(cluster, resource, spec.name, pods) == []

    pods = asyncio.run(_launch_and_adelete(backend, spec, add_pods))
    assert pods and left_of(cluster, resource, spec.name, pods) == []

    cluster.set_pod_termination(None)  # a pod on a lost node: it never finishes terminating
    first = add_pods(backend.launch(spec))[0]
    impatient = backend_from_dict(backend.kind, backend.to_dict() | {"delete_timeout_s": 0.3})
    expected = (rf"{kind} {NS}/{spec.name} was deleted, but 0.3 s later these are still there: {kind} {NS}/"
                rf"{spec.name} \(deleting since .*, finalizers \['foregroundDeletion'\]\); pod {NS}/{first} "
                rf"\(Running, terminating since .*\)\. A pod stuck terminating")
    with pytest.raises(StillDeleting, match=expected):
        impatient.delete(spec.name)
    with pytest.raises(StillDeleting, match=expected):
        asyncio.run(impatient.adelete(spec.name))
