"""KubernetesClient against the kmock API emulator: the calls it makes (which RBAC must allow), retries,
and cluster access from a connection (resolved by operators/connections.py's AirflowConnections)."""
from __future__ import annotations

import asyncio
import json
import logging
import socket

import kmock
import pytest
import yaml

from kmock_cluster import MPIJOBS
from ringflow.training.core.backends.connections import MissingConnections
from ringflow.training.core.backends.kubernetes.client import API_CALLS, KubernetesApiError, KubernetesClient

NS = "training"


def _verb(request) -> tuple[str, str, str]:
    """The RBAC (api group, resource, verb) a request needs, as the API server authorizes it."""
    res = request.resource
    resource = res.plural + (f"/{request.subresource}" if request.subresource else "")
    method = request.method.value.upper()
    verb = {"POST": "create", "DELETE": "delete", "GET": "get" if request.name else "list"}[method]
    return res.group, resource, verb


@pytest.fixture
def client(cluster):
    return KubernetesClient(kubeconfig_path=str(cluster.kubeconfig), backoff_s=0.01)


def _mpijob(name="j", labels=None):
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": name, "namespace": NS, "labels": labels or {"app.kubernetes.io/managed-by": "ringflow"}},
            "spec": {}}


@pytest.mark.job
def test_api_calls_lists_exactly_what_the_client_uses(cluster, client):
    client.create_mpijob(NS, _mpijob())
    client.get_mpijob(NS, "j")
    client.list_mpijobs(NS, "app.kubernetes.io/managed-by=ringflow")
    client.create_configmap(NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}})
    client.create_configmap(NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}})
    cluster.add_pod(NS, "j", "launcher", status={"phase": "Running"})
    cluster.logs[(NS, "j-launcher-0")] = "hello\n"
    assert client.list_pods(NS, "training.kubeflow.org/job-name=j")[0]["metadata"]["name"] == "j-launcher-0"
    assert client.read_pod_log(NS, "j-launcher-0", tail_lines=10) == "hello\n"

    async def async_calls():
        await client.aget_mpijob(NS, "j")
        await client.alist_pods(NS, "a=b")
        assert await client.aread_pod_log(NS, "j-launcher-0") == "hello\n"
        assert await client.adelete_configmap(NS, "c") is True
        assert await client.adelete_mpijob(NS, "j") is True
    asyncio.run(async_calls())
    assert client.delete_mpijob(NS, "j") is False and client.delete_configmap(NS, "c") is False
    # The TrainJob backend's calls (Kubeflow Trainer v2).
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "t"},
                "spec": {"runtimeRef": {"name": "ringflow-torch"}}}
    client.create_trainjob(NS, trainjob)
    client.create_trainjob(NS, trainjob)  # 409: reattach through get
    assert client.list_trainjobs(NS, "")[0]["metadata"]["name"] == "t"
    assert asyncio.run(client.aget_trainjob(NS, "t"))["metadata"]["name"] == "t"
    assert client.delete_trainjob(NS, "t") is True and asyncio.run(client.adelete_trainjob(NS, "t")) is False

    cluster.add_node("n1")
    assert [n["metadata"]["name"] for n in client.list_nodes()] == ["n1"]  # cluster-scoped: the min_workers count

    made = {_verb(r) for r in cluster.requests() if r.resource is not None}
    assert made == set(API_CALLS)


@pytest.mark.job
def test_retries_then_gives_up_on_5xx(cluster, caplog):
    client = KubernetesClient(kubeconfig_path=str(cluster.kubeconfig), backoff_s=0.01, max_attempts=3)
    cluster.k["get", kmock.resource(MPIJOBS)] << 500 << {"kind": "Status", "code": 500, "message": "etcd down"}
    with caplog.at_level(logging.WARNING), pytest.raises(KubernetesApiError, match="HTTP 500.*etcd down") as err:
        client.get_mpijob(NS, "j")
    assert err.value.status == 500
    assert len(cluster.requests("get", MPIJOBS)) == 3
    assert "retrying" in caplog.text


@pytest.mark.job
def test_429_waits_and_succeeds(cluster, client, caplog):
    client.create_mpijob(NS, _mpijob())
    get_job = cluster.k["get", kmock.resource(MPIJOBS)]
    get_job[:2] << 429 << {"kind": "Status", "code": 429, "message": "slow down"}
    # Request 2 is the sync call's success. Then the async client meets 429 twice, with a Retry-After:
    # the client waits that long (capped) instead of its own backoff.
    get_job[3:5] << 429 << cluster.k.headers({"Retry-After": "0"}) << {"kind": "Status", "code": 429}
    with caplog.at_level(logging.WARNING):
        assert client.get_mpijob(NS, "j")["metadata"]["name"] == "j"
        assert asyncio.run(client.aget_mpijob(NS, "j"))["metadata"]["name"] == "j"
    assert caplog.text.count("HTTP 429") == 4 and caplog.text.count("retrying in 0.0s") >= 2
    assert len(cluster.requests("get", MPIJOBS)) == 6


@pytest.mark.job
def test_other_4xx_fail_at_once(cluster, client):
    cluster.k["get", kmock.resource(MPIJOBS)] << 403 << {"kind": "Status", "code": 403,
                                                          "message": "mpijobs is forbidden for system:serviceaccount"}
    with pytest.raises(KubernetesApiError, match="forbidden") as err:
        client.get_mpijob(NS, "j")
    assert err.value.status == 403 and len(cluster.requests("get", MPIJOBS)) == 1
    with pytest.raises(KubernetesApiError, match="HTTP 400.*waiting to start"):
        client.read_pod_log(NS, "missing")


@pytest.mark.job
def test_409_conflict_on_delete_is_retried(cluster, client):
    client.create_mpijob(NS, _mpijob())
    cluster.k[kmock.method.DELETE, kmock.resource(MPIJOBS)][:1] << 409 << {"kind": "Status", "code": 409,
                                                                           "reason": "Conflict"}
    # (The emulator applies the delete even when it answers 409, so the retry finds it gone: still fine.)
    client.delete_mpijob(NS, "j")
    assert len(cluster.requests("delete", MPIJOBS)) == 2


@pytest.mark.job
def test_create_of_our_own_object_reattaches(cluster, client):
    first = client.create_mpijob(NS, _mpijob())
    again = client.create_mpijob(NS, _mpijob())
    assert again["metadata"]["uid"] == first["metadata"]["uid"]


def test_unreachable_server_is_retried_then_reported(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    client = KubernetesClient(kubeconfig_path=str(path), backoff_s=0.01, max_attempts=2)
    with pytest.raises(KubernetesApiError, match="cannot reach the API server"):
        client.list_pods(NS, "a=b")
    with pytest.raises(KubernetesApiError, match="cannot reach the API server"):
        asyncio.run(client.alist_pods(NS, "a=b"))


@pytest.mark.job
def test_cluster_from_an_airflow_connection(cluster, monkeypatch):
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    conn = {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kubeconfig), "namespace": NS}}
    monkeypatch.setenv("AIRFLOW_CONN_RINGFLOW_K8S", json.dumps(conn))
    from ringflow.operators.connections import AirflowConnections

    client = KubernetesClient("ringflow_k8s", connections=AirflowConnections(), backoff_s=0.01)
    assert client.default_namespace == NS
    client.create_mpijob(NS, _mpijob())
    assert [j["metadata"]["name"] for j in client.list_mpijobs(NS, "")] == ["j"]
    aclient = KubernetesClient("ringflow_k8s", connections=AirflowConnections())
    assert asyncio.run(aclient.adefault_namespace()) == NS
    assert asyncio.run(aclient.aget_mpijob(NS, "j"))["metadata"]["name"] == "j"


def test_a_connection_id_without_a_lookup_says_what_to_pass():
    with pytest.raises(MissingConnections, match="connections=AirflowConnections()"):
        KubernetesClient("ringflow_k8s").cluster()
    with pytest.raises(MissingConnections, match="conn_id=None"):
        asyncio.run(KubernetesClient("ringflow_k8s").acluster())


def test_in_cluster_namespace_fallback(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert KubernetesClient().default_namespace == "default"
    assert KubernetesClient(in_cluster=True).cluster().in_cluster


@pytest.mark.job
def test_create_waits_for_a_terminating_namesake(cluster):
    # A foreground delete of an earlier try is still running: never reattach to a dying job.
    client = KubernetesClient(kubeconfig_path=str(cluster.kubeconfig), backoff_s=0.01, max_attempts=2)
    dying = _mpijob()
    dying["metadata"].update(deletionTimestamp="2030-01-01T00:00:00Z", finalizers=["foregroundDeletion"])
    cluster.put(MPIJOBS, NS, "j", dying)
    with pytest.raises(KubernetesApiError, match="still being deleted"):
        client.create_mpijob(NS, _mpijob())
