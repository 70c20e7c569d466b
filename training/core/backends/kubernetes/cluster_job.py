"""What both Kubernetes backends share: one training run = one job object of a Kubernetes operator plus a
ConfigMap with its config; reattach by labels, foreground delete that waits for the pods, log cursors.

The MPIJob backend (mpijob_backend.py) and the TrainJob backend (trainjob_backend.py) each define only what differs
below ClusterJobBackend's line; both import this module, and neither imports the other's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, ClassVar, Sequence

from ..base import Backend, JobNotFound, JobStatus, LogChunk
from ..job_spec import JobSpec
from . import labels as L
from ..connections import Connections
from .capacity import worker_capacity
from .client import KubernetesApiError, KubernetesClient
from .job_parts import build_configmap, configmap_name

log = logging.getLogger(__name__)


class StillDeleting(RuntimeError):
    """A deleted job, or pods of it, were still there when the wait for them to go ran out."""


def still_there(kind: str, namespace: str, name: str, job: dict[str, Any] | None,
                pods: list[dict[str, Any]]) -> list[str]:
    """What is left of a deleted job: the job object and each of its pods, with what holds them. Pure."""
    left = []
    if job is not None:
        meta = job.get("metadata") or {}
        since = meta.get("deletionTimestamp")
        state = f"deleting since {since}, finalizers {meta.get('finalizers') or []}" if since else "not being deleted"
        left.append(f"{kind} {namespace}/{name} ({state})")
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        words = [status.get("phase") or "no phase"]
        if meta.get("deletionTimestamp"):
            words.append(f"terminating since {meta['deletionTimestamp']}")
        if (pod.get("spec") or {}).get("nodeName"):
            words.append(f"on node {pod['spec']['nodeName']}")
        left.append(f"pod {namespace}/{meta.get('name')} ({', '.join(words)})")
    return left


def _created_key(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return meta.get("creationTimestamp") or "", meta.get("name") or ""


def newest_pod(pods: list[dict[str, Any]], label: str, value: str) -> dict[str, Any] | None:
    """The newest pod whose `label` is `value` (a retry's new pod, not the failed one)."""
    chosen = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(label) == value]
    return max(chosen, key=_created_key) if chosen else None


def _container_key(pod: dict[str, Any]) -> str:
    """Which container's log we read: a retry (new pod, or a restart in place) starts a new log."""
    restarts = sum(int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or [])
    return f"{pod['metadata']['name']}#{restarts}"


def _cursor(cursor: Any) -> tuple[str | None, int]:
    """(container, lines already returned). Accepts None, a line count, or what logs() returned."""
    if cursor is None:
        return None, 0
    if isinstance(cursor, int) and not isinstance(cursor, bool):
        return None, cursor
    if isinstance(cursor, dict):
        return cursor.get("container"), int(cursor.get("lines") or 0)
    raise ValueError(f"log cursor {cursor!r} is not one this backend returned")


def _chunk(key: str, text: str, cursor: Any) -> LogChunk:
    """The lines after the cursor: a plain JSON cursor {"container": "<pod>#<restarts>", "lines": n}."""
    seen, done = _cursor(cursor)
    lines = text.splitlines()
    if text and not text.endswith("\n"):
        lines = lines[:-1]  # a line still being written: return it whole, next time
    start = done if seen in (None, key) else 0
    return LogChunk(lines=lines[start:], next_cursor={"container": key, "lines": max(start, len(lines))})


class ClusterJobBackend(Backend):
    """One training run = one job object of a Kubernetes operator (`resource`) plus its config ConfigMap.

    What differs between job kinds is below the line in each subclass: the settings, the manifest, the
    conditions that mean finished, the label the pods carry, how their status reads, whose log to follow.
    """

    settings_class: ClassVar[type]
    resource: ClassVar[str]            # the client's ops: create_<resource>, get_<resource>, ...
    api_version: ClassVar[str]
    object_kind: ClassVar[str]
    finished_conditions: ClassVar[tuple[str, ...]]
    pod_job_label: ClassVar[str]       # set on every pod of the job by its operator, value = the job's name

    def __init__(
        self,
        settings: dict[str, Any],
        conn_id: str | None = None,
        kubeconfig_path: str | None = None,
        in_cluster: bool | None = None,
        context: str | None = None,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        delete_timeout_s: float = 300.0,
        delete_poll_s: float = 2.0,
        connections: Connections | None = None,
    ) -> None:
        """delete_timeout_s: how long delete() waits for the job object and its pods to be gone before it
        raises StillDeleting (pods get their terminationGracePeriodSeconds, 30 s by default, and a busy
        kubelet more); delete_poll_s: how often it looks."""
        cls = self.settings_class
        self.settings = cls.from_dict(settings) if isinstance(settings, dict) else settings
        if not isinstance(self.settings, cls):
            raise TypeError(f"settings must be a dict of {cls.__name__} fields")
        self.conn_id, self.kubeconfig_path, self.in_cluster, self.context = conn_id, kubeconfig_path, in_cluster, context
        self.max_attempts, self.backoff_s = max_attempts, backoff_s
        if not (delete_timeout_s >= 0 and delete_poll_s > 0):
            raise ValueError(f"delete_timeout_s {delete_timeout_s!r} / delete_poll_s {delete_poll_s!r}: use seconds, "
                             ">= 0 for the timeout and > 0 between looks")
        self.delete_timeout_s, self.delete_poll_s = delete_timeout_s, delete_poll_s
        self.connections = connections
        self.client = KubernetesClient(conn_id, connections=connections, kubeconfig_path=kubeconfig_path,
                                       in_cluster=in_cluster, context=context, max_attempts=max_attempts,
                                       backoff_s=backoff_s)

    # -- what each job kind defines -------------------------------------------------------------
    def build(self, spec: JobSpec, settings: Any) -> dict[str, Any]:
        raise NotImplementedError

    def outcome(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
        raise NotImplementedError

    def log_pod(self, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The pod whose log shows every rank's output (or rank 0's), or None before it exists."""
        raise NotImplementedError

    def explain_create_error(self, error: KubernetesApiError) -> KubernetesApiError:
        return error

    # -- shared ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings.to_dict(), "conn_id": self.conn_id, "kubeconfig_path": self.kubeconfig_path,
                "in_cluster": self.in_cluster, "context": self.context, "max_attempts": self.max_attempts,
                "backoff_s": self.backoff_s, "delete_timeout_s": self.delete_timeout_s,
                "delete_poll_s": self.delete_poll_s}

    @property
    def namespace(self) -> str:
        return self.settings.namespace or self.client.default_namespace

    async def anamespace(self) -> str:
        return self.settings.namespace or await self.client.adefault_namespace()

    def _pods_selector(self, job_id: str) -> str:
        # The operator's own label: exact for this job, whatever labels the caller used.
        return f"{self.pod_job_label}={job_id}"

    def _finished(self, job: dict[str, Any]) -> bool:
        conds = (job.get("status") or {}).get("conditions") or []
        return any(c.get("type") in self.finished_conditions and c.get("status") == "True" for c in conds)

    def _call(self, op: str) -> Any:
        return getattr(self.client, op.format(self.resource))

    # -- capacity -------------------------------------------------------------------------------
    def capacity(self, num_workers: int, avoid_nodes: Sequence[str] = ()) -> int:
        """Ready, schedulable nodes the workers' node selector and tolerations allow, less `avoid_nodes`, one
        worker each (capacity.py), at most num_workers."""
        nodes = self.client.list_nodes()
        return min(num_workers, worker_capacity(nodes, self.settings.node_selector, self.settings.tolerations,
                                                avoid_nodes))

    # -- launch / reattach ----------------------------------------------------------------------
    def manifests(self, spec: JobSpec) -> tuple[dict[str, Any], dict[str, Any]]:
        """(job, ConfigMap) as launch() submits them (the ConfigMap gets its owner once the job exists)."""
        settings = dataclasses.replace(self.settings, namespace=self.namespace)
        return self.build(spec, settings), build_configmap(spec, settings)

    def launch(self, spec: JobSpec) -> str:
        job, configmap = self.manifests(spec)
        ns = self.namespace
        try:
            created = self._call("create_{}")(ns, job)
        except KubernetesApiError as e:
            raise self.explain_create_error(e) from e
        # The job owns the ConfigMap, so deleting the job (or its TTL) removes the config too. The pods
        # wait for the ConfigMap volume, so creating it second is safe.
        meta = created.get("metadata") or {}
        configmap["metadata"]["ownerReferences"] = [{
            "apiVersion": self.api_version, "kind": self.object_kind, "name": spec.name, "uid": meta.get("uid", ""),
        }]
        try:
            self.client.create_configmap(ns, configmap)
        except Exception:
            # Without its config the job can never start: do not leave it waiting forever.
            try:
                self.delete(spec.name)
            except Exception:
                log.exception("could not clean up %s %s/%s after a failed launch", self.object_kind, ns, spec.name)
            raise
        return spec.name

    def find(self, labels: dict[str, str]) -> str | None:
        if not labels:
            return None  # no labels would match every ringflow job: never reattach to a stranger's
        items = self._call("list_{}s")(self.namespace, L.selector(labels))
        live = [j for j in items if L.carries(j, labels) and not self._finished(j)
                and not (j.get("metadata") or {}).get("deletionTimestamp")]
        live.sort(key=lambda j: (j["metadata"].get("creationTimestamp") or "", j["metadata"]["name"]))
        return live[-1]["metadata"]["name"] if live else None

    # -- status ---------------------------------------------------------------------------------
    def _job_or_none(self, ns: str, job_id: str) -> dict[str, Any] | None:
        try:
            return self._call("get_{}")(ns, job_id)
        except KubernetesApiError as e:
            if e.status == 404:
                return None
            raise

    async def _ajob_or_none(self, ns: str, job_id: str) -> dict[str, Any] | None:
        try:
            return await self._call("aget_{}")(ns, job_id)
        except KubernetesApiError as e:
            if e.status == 404:
                return None
            raise

    def status(self, job_id: str) -> JobStatus:
        ns = self.namespace
        job = self._job_or_none(ns, job_id)
        if job is None:
            raise JobNotFound(f"no {self.object_kind} {ns}/{job_id}")
        return self.outcome(job, self.client.list_pods(ns, self._pods_selector(job_id)))

    async def astatus(self, job_id: str) -> JobStatus:
        ns = await self.anamespace()
        job = await self._ajob_or_none(ns, job_id)
        if job is None:
            raise JobNotFound(f"no {self.object_kind} {ns}/{job_id}")
        return self.outcome(job, await self.client.alist_pods(ns, self._pods_selector(job_id)))

    # -- logs -----------------------------------------------------------------------------------
    def logs(self, job_id: str, cursor: Any = None) -> LogChunk:
        _cursor(cursor)  # a cursor we cannot read fails before any API call
        ns = self.namespace
        pod = self.log_pod(self.client.list_pods(ns, self._pods_selector(job_id)))
        if pod is None:
            return LogChunk(lines=[], next_cursor=cursor)
        try:
            text = self.client.read_pod_log(ns, pod["metadata"]["name"])
        except KubernetesApiError as e:
            if e.status in (400, 404):  # container not started yet, or pod just replaced
                return LogChunk(lines=[], next_cursor=cursor)
            raise
        return _chunk(_container_key(pod), text, cursor)

    async def alogs(self, job_id: str, cursor: Any = None) -> LogChunk:
        _cursor(cursor)
        ns = await self.anamespace()
        pod = self.log_pod(await self.client.alist_pods(ns, self._pods_selector(job_id)))
        if pod is None:
            return LogChunk(lines=[], next_cursor=cursor)
        try:
            text = await self.client.aread_pod_log(ns, pod["metadata"]["name"])
        except KubernetesApiError as e:
            if e.status in (400, 404):
                return LogChunk(lines=[], next_cursor=cursor)
            raise
        return _chunk(_container_key(pod), text, cursor)

    # -- delete ---------------------------------------------------------------------------------
    # A foreground delete only starts the deletion: the API server keeps the job while its pods terminate
    # (their grace period), and a rank's pod can go on writing to the run folder all that time. So delete
    # returns once the job object and every pod of it are gone, and a retry launched after it never runs
    # beside this attempt.
    def delete(self, job_id: str) -> None:
        """Delete the job (foreground) and its ConfigMap; return once the job and its pods are gone. Raises
        StillDeleting, naming what is left, when delete_timeout_s passes first."""
        ns = self.namespace
        self._call("delete_{}")(ns, job_id)
        # The garbage collector removes the owned ConfigMap anyway; deleting it here also covers a
        # ConfigMap whose job never got created.
        self.client.delete_configmap(ns, configmap_name(job_id))
        deadline = time.monotonic() + self.delete_timeout_s
        while left := still_there(self.object_kind, ns, job_id, self._job_or_none(ns, job_id),
                                  self.client.list_pods(ns, self._pods_selector(job_id))):
            if time.monotonic() >= deadline:
                raise self._still_deleting(ns, job_id, left)
            time.sleep(self.delete_poll_s)

    async def adelete(self, job_id: str) -> None:
        ns = await self.anamespace()
        await self._call("adelete_{}")(ns, job_id)
        await self.client.adelete_configmap(ns, configmap_name(job_id))
        deadline = time.monotonic() + self.delete_timeout_s
        while left := still_there(self.object_kind, ns, job_id, await self._ajob_or_none(ns, job_id),
                                  await self.client.alist_pods(ns, self._pods_selector(job_id))):
            if time.monotonic() >= deadline:
                raise self._still_deleting(ns, job_id, left)
            await asyncio.sleep(self.delete_poll_s)

    def _still_deleting(self, ns: str, job_id: str, left: list[str]) -> StillDeleting:
        return StillDeleting(
            f"{self.object_kind} {ns}/{job_id} was deleted, but {self.delete_timeout_s:g} s later these are still "
            f"there: {'; '.join(left)}. A pod stuck "
            "terminating waits for its node or a finalizer (kubectl describe pod); until it is gone a retry "
            "could run beside it. Raise delete_timeout_s if the cluster is only slow")
