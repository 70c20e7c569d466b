"""The Kubernetes API client of the MPIJob and TrainJob backends: sync (kubernetes) for the operator, async
(kubernetes_asyncio) for the trigger, with the same retry policy. Not an Airflow hook, and not built on the
cncf.kubernetes provider's: the core must run without Airflow (the CLI, scripts), and that provider's hooks
need Airflow and its connection store (and are not a dependency here); the connection -> ClusterConfig
adapter lives in operators/connections.py.

Cluster access, first match wins: an explicit kubeconfig path (tests point it at an emulator), in_cluster=True,
a connection id resolved through `connections` (backends/connections.py), in-cluster config when running in
a pod, else ~/.kube/config.

Retries: 429, 5xx, 409 (a write conflict) and connection errors, with exponential backoff and jitter (or the
server's Retry-After). Other 4xx fail at once. A create that answers 409 "already exists" is a reattach:
the existing object is returned when it carries the same labels, else a clear error.

Every call goes through `API_CALLS`, the (api group, resource, verb) pairs the client uses: deploy/rbac.yaml
must grant exactly these (tests/deploy checks it).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from typing import Any, Callable

from ..connections import Connections, require
from . import mpijob, trainjob  # the CRDs, each defined once
from .settings import ClusterConfig

log = logging.getLogger(__name__)
_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _custom_object_ops(kind: str, group: str, version: str, plural: str) -> dict[str, Any]:
    """create/get/list/delete of one custom resource (MPIJobs, TrainJobs)."""
    return {
        f"create_{kind}": ((group, plural, "create"), lambda c, api, o, ns, body: c.CustomObjectsApi(api)
                           .create_namespaced_custom_object(group, version, ns, plural, body, **o)),
        f"get_{kind}": ((group, plural, "get"), lambda c, api, o, ns, name: c.CustomObjectsApi(api)
                        .get_namespaced_custom_object(group, version, ns, plural, name, **o)),
        f"list_{kind}s": ((group, plural, "list"), lambda c, api, o, ns, selector: c.CustomObjectsApi(api)
                          .list_namespaced_custom_object(group, version, ns, plural, label_selector=selector, **o)),
        # Foreground: the job disappears only after its pods (and our ConfigMap, which it owns) are gone, so
        # a retry never races the previous attempt's pods.
        f"delete_{kind}": ((group, plural, "delete"), lambda c, api, o, ns, name: c.CustomObjectsApi(api)
                           .delete_namespaced_custom_object(group, version, ns, plural, name,
                                                            body={"propagationPolicy": "Foreground"}, **o)),
    }


# op -> ((api group, resource, RBAC verb), call). A call gets (client module, ApiClient, *args) and returns
# the raw response (never deserialized into models: we work with the JSON, as the API returns it).
_OPS: dict[str, tuple[tuple[str, str, str], Callable[..., Any]]] = {
    **_custom_object_ops("mpijob", mpijob.GROUP, mpijob.VERSION, mpijob.PLURAL),
    **_custom_object_ops("trainjob", trainjob.GROUP, trainjob.VERSION, trainjob.PLURAL),
    "create_configmap": (("", "configmaps", "create"), lambda c, api, o, ns, body: c.CoreV1Api(api)
                         .create_namespaced_config_map(ns, body, **o)),
    "get_configmap": (("", "configmaps", "get"), lambda c, api, o, ns, name: c.CoreV1Api(api)
                      .read_namespaced_config_map(name, ns, **o)),
    "delete_configmap": (("", "configmaps", "delete"), lambda c, api, o, ns, name: c.CoreV1Api(api)
                         .delete_namespaced_config_map(name, ns, **o)),
    "list_pods": (("", "pods", "list"), lambda c, api, o, ns, selector: c.CoreV1Api(api)
                  .list_namespaced_pod(ns, label_selector=selector, **o)),
    "read_pod_log": (("", "pods/log", "get"), lambda c, api, o, ns, name, kw: c.CoreV1Api(api)
                     .read_namespaced_pod_log(name, ns, **o, **kw)),
    # Cluster-scoped (a ClusterRole grants it): how many workers the cluster can place (capacity.py).
    "list_nodes": (("", "nodes", "list"), lambda c, api, o: c.CoreV1Api(api).list_node(**o)),
}
API_CALLS: frozenset[tuple[str, str, str]] = frozenset(rbac for rbac, _ in _OPS.values())


class KubernetesApiError(RuntimeError):
    """A Kubernetes API call failed (after retries, where retrying made sense)."""

    def __init__(self, op: str, status: int, reason: str, body: str = "", retry_after: float | None = None):
        self.op, self.status, self.reason, self.body, self.retry_after = op, status, reason, body, retry_after
        message = _status_message(body) or reason
        super().__init__(f"Kubernetes {op} failed: HTTP {status} {reason}: {message}"[:2000])


class AlreadyExistsError(KubernetesApiError):
    """A create found an object of that name that is not ours (other labels): nothing to reattach to."""


def _status_message(body: str) -> str:
    try:
        return str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        return (body or "")[:300]


def _retry_after(headers: Any) -> float | None:
    try:
        return float((headers or {}).get("Retry-After"))
    except (TypeError, ValueError):
        return None


class KubernetesClient:
    def __init__(
        self,
        conn_id: str | None = None,
        *,
        connections: Connections | None = None,
        kubeconfig_path: str | None = None,
        in_cluster: bool | None = None,
        context: str | None = None,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        request_timeout_s: float = 30.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.conn_id, self.connections = conn_id, connections
        self.kubeconfig_path = kubeconfig_path
        self.in_cluster = in_cluster
        self.context = context
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.request_timeout_s = request_timeout_s
        self._cluster: ClusterConfig | None = None
        self._sync_client: Any = None
        self._async_config: Any = None

    # -- cluster access -------------------------------------------------------------------------
    def _explicit(self) -> ClusterConfig | None:
        if self.kubeconfig_path:
            return ClusterConfig(kubeconfig_path=self.kubeconfig_path, context=self.context)
        if self.in_cluster:
            return ClusterConfig(in_cluster=True)
        return None

    def _fallback(self) -> ClusterConfig:
        # In a pod (the Airflow chart's scheduler/triggerer), the service account is the natural identity.
        in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        return ClusterConfig(in_cluster=in_pod and self.in_cluster is not False, context=self.context)

    def cluster(self) -> ClusterConfig:
        if self._cluster is None:
            found = self._explicit()
            if found is None and self.conn_id:
                found = require(self.connections, self.conn_id, "the Kubernetes client").cluster(self.conn_id)
            self._cluster = found or self._fallback()
        return self._cluster

    async def acluster(self) -> ClusterConfig:
        if self._cluster is None:
            found = self._explicit()
            if found is None and self.conn_id:
                # The triggerer's event loop must not block on the sync connection lookup.
                found = await require(self.connections, self.conn_id, "the Kubernetes client").acluster(self.conn_id)
            self._cluster = found or self._fallback()
        return self._cluster

    @property
    def default_namespace(self) -> str:
        return _namespace(self.cluster())

    async def adefault_namespace(self) -> str:
        return _namespace(await self.acluster())

    def _client(self) -> Any:
        if self._sync_client is None:
            from kubernetes import client, config

            cfg = client.Configuration()
            _load(config, self.cluster(), cfg)
            # urllib3 would otherwise retry on its own (connection errors; 429/503 with Retry-After),
            # stacking its retries under ours: one policy, the one below.
            cfg.retries = 0
            self._sync_client = client.ApiClient(configuration=cfg)
        return self._sync_client

    async def _aconfig(self) -> Any:
        if self._async_config is None:
            from kubernetes_asyncio import client, config

            cfg = client.Configuration()
            cluster = await self.acluster()
            if cluster.in_cluster:
                config.load_incluster_config(client_configuration=cfg)
            elif cluster.kubeconfig:
                await config.load_kube_config_from_dict(cluster.kubeconfig, context=cluster.context,
                                                        client_configuration=cfg)
            else:
                await config.load_kube_config(config_file=cluster.kubeconfig_path, context=cluster.context,
                                              client_configuration=cfg)
            self._async_config = cfg
        return self._async_config

    def _options(self) -> dict[str, Any]:
        # Raw responses (we parse the JSON ourselves) and a timeout: a hung API server must not hang a task.
        return {"_preload_content": False, "_request_timeout": self.request_timeout_s}

    # -- retry policy ---------------------------------------------------------------------------
    def _delay(self, attempt: int, error: KubernetesApiError, retry_conflict: bool) -> float | None:
        """Seconds to wait before the next attempt, or None to give up."""
        retryable = error.status == 0 or error.status == 429 or error.status >= 500 or (
            error.status == 409 and retry_conflict)
        if not retryable or attempt >= self.max_attempts:
            return None
        if error.retry_after is not None:
            return min(error.retry_after, self.max_backoff_s)
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)

    def _raw(self, op: str, *args: Any, retry_conflict: bool = True) -> bytes:
        from kubernetes import client
        import urllib3

        (_, call) = _OPS[op]
        for attempt in range(1, self.max_attempts + 1):
            try:
                return call(client, self._client(), self._options(), *args).data
            except client.ApiException as e:
                error = KubernetesApiError(op, int(e.status or 0), str(e.reason or ""), _text(e.body),
                                           _retry_after(e.headers))
            except urllib3.exceptions.HTTPError as e:
                error = KubernetesApiError(op, 0, f"cannot reach the API server: {e}")
            delay = self._delay(attempt, error, retry_conflict)
            if delay is None:
                raise error
            log.warning("%s; retrying in %.1fs (attempt %d of %d)", error, delay, attempt + 1, self.max_attempts)
            time.sleep(delay)
        raise AssertionError("unreachable")

    async def _araw(self, op: str, *args: Any, retry_conflict: bool = True) -> bytes:
        import aiohttp
        from kubernetes_asyncio import client

        (_, call) = _OPS[op]
        cfg = await self._aconfig()
        for attempt in range(1, self.max_attempts + 1):
            try:
                # One client per call: an aiohttp session belongs to the loop that made it.
                async with client.ApiClient(configuration=cfg) as api:
                    response = await call(client, api, self._options(), *args)
                    body = await response.read()
                    if 200 <= response.status <= 299:
                        return body
                    error = KubernetesApiError(op, response.status, str(response.reason or ""), _text(body),
                                               _retry_after(response.headers))
            except client.ApiException as e:
                error = KubernetesApiError(op, int(e.status or 0), str(e.reason or ""), _text(e.body),
                                           _retry_after(e.headers))
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                error = KubernetesApiError(op, 0, f"cannot reach the API server: {e!r}")
            delay = self._delay(attempt, error, retry_conflict)
            if delay is None:
                raise error
            log.warning("%s; retrying in %.1fs (attempt %d of %d)", error, delay, attempt + 1, self.max_attempts)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _json(self, op: str, *args: Any, **kw: Any) -> Any:
        return json.loads(self._raw(op, *args, **kw) or b"null")

    async def _ajson(self, op: str, *args: Any, **kw: Any) -> Any:
        return json.loads(await self._araw(op, *args, **kw) or b"null")

    # -- MPIJobs ----------------------------------------------------------------------------------
    def create_mpijob(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._create("mpijob", namespace, body)

    def get_mpijob(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json("get_mpijob", namespace, name)

    async def aget_mpijob(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._ajson("get_mpijob", namespace, name)

    def list_mpijobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._json("list_mpijobs", namespace, label_selector).get("items") or []

    def delete_mpijob(self, namespace: str, name: str) -> bool:
        """Delete (foreground). False when it was already gone."""
        return _gone_ok(lambda: self._raw("delete_mpijob", namespace, name))

    async def adelete_mpijob(self, namespace: str, name: str) -> bool:
        return await _agone_ok(self._araw("delete_mpijob", namespace, name))

    # -- TrainJobs (Kubeflow Trainer v2) -----------------------------------------------------------
    def create_trainjob(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._create("trainjob", namespace, body)

    def get_trainjob(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json("get_trainjob", namespace, name)

    async def aget_trainjob(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._ajson("get_trainjob", namespace, name)

    def list_trainjobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._json("list_trainjobs", namespace, label_selector).get("items") or []

    def delete_trainjob(self, namespace: str, name: str) -> bool:
        """Delete (foreground: the JobSet and its pods go first). False when it was already gone."""
        return _gone_ok(lambda: self._raw("delete_trainjob", namespace, name))

    async def adelete_trainjob(self, namespace: str, name: str) -> bool:
        return await _agone_ok(self._araw("delete_trainjob", namespace, name))

    # -- ConfigMaps -------------------------------------------------------------------------------
    def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._create("configmap", namespace, body)

    def delete_configmap(self, namespace: str, name: str) -> bool:
        return _gone_ok(lambda: self._raw("delete_configmap", namespace, name))

    async def adelete_configmap(self, namespace: str, name: str) -> bool:
        return await _agone_ok(self._araw("delete_configmap", namespace, name))

    # -- pods -------------------------------------------------------------------------------------
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._json("list_pods", namespace, label_selector).get("items") or []

    async def alist_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return (await self._ajson("list_pods", namespace, label_selector)).get("items") or []

    def read_pod_log(self, namespace: str, name: str, *, container: str | None = None,
                     since_seconds: int | None = None, tail_lines: int | None = None) -> str:
        raw = self._raw("read_pod_log", namespace, name, _log_args(container, since_seconds, tail_lines))
        return raw.decode("utf-8", errors="replace")

    async def aread_pod_log(self, namespace: str, name: str, *, container: str | None = None,
                            since_seconds: int | None = None, tail_lines: int | None = None) -> str:
        raw = await self._araw("read_pod_log", namespace, name, _log_args(container, since_seconds, tail_lines))
        return raw.decode("utf-8", errors="replace")

    # -- nodes ------------------------------------------------------------------------------------
    def list_nodes(self) -> list[dict[str, Any]]:
        return self._json("list_nodes").get("items") or []

    # -- create, or reattach to what an earlier attempt created -------------------------------------
    def _create(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        for attempt in range(1, self.max_attempts + 1):
            try:
                # 409 is not retried here: for a create it means "exists", which we resolve below.
                return self._json(f"create_{kind}", namespace, body, retry_conflict=False)
            except KubernetesApiError as e:
                if e.status != 409:
                    raise
                conflict = e
            try:
                existing = self._json(f"get_{kind}", namespace, name)
            except KubernetesApiError as e:
                if e.status != 404:  # deleted in between: just create again
                    raise
                continue
            if not _same_labels(existing, body):
                raise AlreadyExistsError(
                    conflict.op, 409, "AlreadyExists",
                    json.dumps({"message": f"a {kind} named {name!r} already exists in namespace {namespace!r} "
                                           "but was not made for this job (its labels differ); delete it or "
                                           "choose another job name"}),
                )
            if not (existing.get("metadata") or {}).get("deletionTimestamp"):
                log.info("%s %s/%s already exists with our labels: reattaching", kind, namespace, name)
                return existing
            # Still being deleted (a previous attempt's foreground delete): wait, then create anew.
            time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
        raise KubernetesApiError(f"create_{kind}", 409, "Conflict",
                                 json.dumps({"message": f"{kind} {namespace}/{name} is still being deleted"}))


def _load(config: Any, cluster: ClusterConfig, cfg: Any) -> None:
    if cluster.in_cluster:
        config.load_incluster_config(client_configuration=cfg)
    elif cluster.kubeconfig:
        config.load_kube_config_from_dict(cluster.kubeconfig, context=cluster.context, client_configuration=cfg)
    else:
        config.load_kube_config(config_file=cluster.kubeconfig_path, context=cluster.context,
                                client_configuration=cfg)


def _namespace(cluster: ClusterConfig) -> str:
    if cluster.namespace:
        return cluster.namespace
    if cluster.in_cluster and os.path.exists(_SA_NAMESPACE):
        with open(_SA_NAMESPACE) as f:
            return f.read().strip() or "default"
    return "default"


def _text(body: Any) -> str:
    if isinstance(body, bytes):
        return body.decode("utf-8", errors="replace")
    return str(body or "")


def _log_args(container: str | None, since_seconds: int | None, tail_lines: int | None) -> dict[str, Any]:
    args = {"container": container, "since_seconds": since_seconds, "tail_lines": tail_lines}
    return {k: v for k, v in args.items() if v is not None}


def _same_labels(existing: dict[str, Any], body: dict[str, Any]) -> bool:
    have = (existing.get("metadata") or {}).get("labels") or {}
    want = (body.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in want.items())


def _gone_ok(delete: Callable[[], Any]) -> bool:
    try:
        delete()
        return True
    except KubernetesApiError as e:
        if e.status == 404:
            return False
        raise


async def _agone_ok(delete: Any) -> bool:
    try:
        await delete
        return True
    except KubernetesApiError as e:
        if e.status == 404:
            return False
        raise
