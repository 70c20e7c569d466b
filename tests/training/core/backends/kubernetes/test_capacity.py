"""Workers a cluster can place now: Ready, schedulable nodes the selector and tolerations allow (a table), and
the operator's min_workers against a kmock cluster that lost a node: the retry launches fewer workers, and
refuses below min_workers."""
import types

import pytest

from backend_checks import NS
from kmock_cluster import MPIJOBS
from ringflow.training.core.backends.kubernetes.capacity import worker_capacity


def node(ready=True, unschedulable=False, labels=None, taints=(), name="n"):
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"unschedulable": unschedulable, "taints": list(taints)},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize("nodes, selector, tolerations, count", [
    ([node(), node(), node()], {}, [], 3),
    ([node(), node(ready=False), node(unschedulable=True)], {}, [], 1),           # NotReady, cordoned
    ([node(labels={"pool": "gpu"}), node(labels={"pool": "cpu"})], {"pool": "gpu"}, [], 1),
    ([node(taints=[GPU_TAINT]), node()], {}, [], 1),                                # tainted, not tolerated
    ([node(taints=[GPU_TAINT]), node()], {}, [{"key": "nvidia.com/gpu", "operator": "Exists"}], 2),
    ([node(taints=[GPU_TAINT])], {}, [{"key": "nvidia.com/gpu", "value": "absent"}], 0),
    ([node(taints=[{"key": "a", "effect": "PreferNoSchedule"}])], {}, [], 1),       # only discouraged
    ([], {}, [], 0),
])
def test_ready_schedulable_nodes_the_workers_may_use(nodes, selector, tolerations, count):
    assert worker_capacity(nodes, selector, tolerations) == count


def test_nodes_a_remedy_avoids_are_not_counted():
    """A straggler's node, kept off by remediation (required anti-affinity): min_workers must not count it."""
    nodes = [node(name="a"), node(name="b"), node(name="c")]
    assert worker_capacity(nodes, {}, [], avoid_nodes=("b",)) == 2
    assert worker_capacity(nodes, {}, [], avoid_nodes=("b", "c", "z")) == 1


def context(try_number):
    return {"ti": types.SimpleNamespace(dag_id="ringflow_retrain", run_id="manual__2026-12-01T00:00:00+00:00",
                                        task_id="train", try_number=try_number)}


@pytest.mark.job
def test_a_retry_after_a_lost_node_launches_fewer_workers_down_to_min_workers(cluster, backend, digits_manifest,
                                                                              tmp_path):
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    from ringflow.operators.train import TrainOperator

    for i in range(3):
        cluster.add_node(f"n{i}", labels={"pool": "train"})
    cluster.add_node("cordoned", unschedulable=True)
    backend.connections = object()  # as the operator's: it would rebuild a backend without one

    def try_(number, **kwargs):
        op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"),
                           num_workers=3, min_workers=2, backend=backend, **kwargs)
        with pytest.raises(TaskDeferred):
            op.execute(context(number))
        job = cluster.get(MPIJOBS, NS, op._job_id)
        backend.delete(op._job_id)
        return job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]

    assert try_(1) == 3
    cluster.add_node("n2", ready=False, labels={"pool": "train"})  # the node is lost
    assert try_(2) == 2
    cluster.add_node("n1", ready=False, labels={"pool": "train"})
    op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"),
                       num_workers=3, min_workers=2, backend=backend)
    creates = len(created_jobs(cluster))
    with pytest.raises(AirflowException, match=r"can place 1 worker\(s\) now and this task needs at least 2 \(of 3\)"):
        op.execute(context(3))
    assert len(created_jobs(cluster)) == creates == 2  # nothing launched


def created_jobs(cluster):
    return [r for r in cluster.requests() if r.resource is not None and r.resource.plural == "mpijobs"
            and r.method.value.upper() == "POST"]
