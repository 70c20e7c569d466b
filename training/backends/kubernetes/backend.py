"""The "kubernetes" backend: one training run is one MPIJob (kubeflow/mpi-operator v2beta1) plus a ConfigMap.

Job id = the MPIJob name (JobSpec.name), in the namespace of the settings (or the connection's).
The constructor takes plain JSON, so `backend_from_dict("kubernetes", backend.to_dict(), connections)` rebuilds
it in the triggerer; `conn_id` names the cluster connection that `connections` resolves (backends/connections.py).
"""
from __future__ import annotations

import logging
from typing import Any

from ringflow.training.backends.base import Backend, JobNotFound, JobStatus, LogChunk
from ringflow.training.backends.job_spec import JobSpec
from ringflow.training.backends.kubernetes import labels as L
from ringflow.training.backends.connections import Connections
from ringflow.training.backends.kubernetes.client import KubernetesApiError, KubernetesClient
from ringflow.training.backends.kubernetes.mpijob import (API_VERSION, KIND, MPIJobSettings, build_configmap,
                                                          build_mpijob, configmap_name)
from ringflow.training.backends.kubernetes.outcome import outcome_from_status

log = logging.getLogger(__name__)


def _pods_selector(job_id: str) -> str:
    # The operator's own label: exact for this job, whatever labels the caller used.
    return f"{L.JOB_NAME_LABEL}={job_id}"


def _finished(mpijob: dict[str, Any]) -> bool:
    conds = (mpijob.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True" for c in conds)


def _newest_launcher(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    launchers = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(L.JOB_ROLE_LABEL) == "launcher"]
    launchers.sort(key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "",
                                  (p.get("metadata") or {}).get("name") or ""))
    return launchers[-1] if launchers else None


def _container_key(pod: dict[str, Any]) -> str:
    """Which launcher container's log we read: a retry (new pod, or a restart in place) starts a new log."""
    restarts = sum(int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or [])
    return f"{pod['metadata']['name']}#{restarts}"


def _cursor(cursor: Any) -> tuple[str | None, int]:
    """(launcher container, lines already returned). Accepts None, a line count, or what logs() returned."""
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


class MPIJobBackend(Backend):
    kind = "kubernetes"

    def __init__(
        self,
        settings: dict[str, Any],
        conn_id: str | None = None,
        kubeconfig_path: str | None = None,
        in_cluster: bool | None = None,
        context: str | None = None,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        connections: Connections | None = None,
    ) -> None:
        self.settings = MPIJobSettings.from_dict(settings) if isinstance(settings, dict) else settings
        if not isinstance(self.settings, MPIJobSettings):
            raise TypeError("settings must be a dict of MPIJobSettings fields")
        self.conn_id, self.kubeconfig_path, self.in_cluster, self.context = conn_id, kubeconfig_path, in_cluster, context
        self.max_attempts, self.backoff_s = max_attempts, backoff_s
        self.connections = connections
        self.client = KubernetesClient(conn_id, connections=connections, kubeconfig_path=kubeconfig_path,
                                       in_cluster=in_cluster, context=context, max_attempts=max_attempts,
                                       backoff_s=backoff_s)

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings.to_dict(), "conn_id": self.conn_id, "kubeconfig_path": self.kubeconfig_path,
                "in_cluster": self.in_cluster, "context": self.context, "max_attempts": self.max_attempts,
                "backoff_s": self.backoff_s}

    @property
    def namespace(self) -> str:
        return self.settings.namespace or self.client.default_namespace

    async def anamespace(self) -> str:
        return self.settings.namespace or await self.client.adefault_namespace()

    # -- launch / reattach ----------------------------------------------------------------------
    def manifests(self, spec: JobSpec) -> tuple[dict[str, Any], dict[str, Any]]:
        """(MPIJob, ConfigMap) as launch() submits them (the ConfigMap gets its owner once the MPIJob exists)."""
        import dataclasses

        settings = dataclasses.replace(self.settings, namespace=self.namespace)
        return build_mpijob(spec, settings), build_configmap(spec, settings)

    def launch(self, spec: JobSpec) -> str:
        mpijob, configmap = self.manifests(spec)
        ns = self.namespace
        created = self.client.create_mpijob(ns, mpijob)
        # The MPIJob owns the ConfigMap, so deleting the job (or its TTL) removes the config too. The pods
        # wait for the ConfigMap volume, so creating it second is safe.
        meta = created.get("metadata") or {}
        configmap["metadata"]["ownerReferences"] = [{
            "apiVersion": API_VERSION, "kind": KIND, "name": spec.name, "uid": meta.get("uid", ""),
        }]
        try:
            self.client.create_configmap(ns, configmap)
        except Exception:
            # Without its config the job can never start: do not leave it waiting forever.
            try:
                self.delete(spec.name)
            except Exception:
                log.exception("could not clean up MPIJob %s/%s after a failed launch", ns, spec.name)
            raise
        return spec.name

    def find(self, labels: dict[str, str]) -> str | None:
        if not labels:
            return None  # no labels would match every ringflow job: never reattach to a stranger's
        items = self.client.list_mpijobs(self.namespace, L.selector(labels))
        live = [j for j in items if L.carries(j, labels) and not _finished(j)
                and not (j.get("metadata") or {}).get("deletionTimestamp")]
        live.sort(key=lambda j: (j["metadata"].get("creationTimestamp") or "", j["metadata"]["name"]))
        return live[-1]["metadata"]["name"] if live else None

    # -- status ---------------------------------------------------------------------------------
    def status(self, job_id: str) -> JobStatus:
        ns = self.namespace
        try:
            mpijob = self.client.get_mpijob(ns, job_id)
        except KubernetesApiError as e:
            if e.status == 404:
                raise JobNotFound(f"no MPIJob {ns}/{job_id}") from e
            raise
        return outcome_from_status(mpijob, self.client.list_pods(ns, _pods_selector(job_id)))

    async def astatus(self, job_id: str) -> JobStatus:
        ns = await self.anamespace()
        try:
            mpijob = await self.client.aget_mpijob(ns, job_id)
        except KubernetesApiError as e:
            if e.status == 404:
                raise JobNotFound(f"no MPIJob {ns}/{job_id}") from e
            raise
        return outcome_from_status(mpijob, await self.client.alist_pods(ns, _pods_selector(job_id)))

    # -- logs: the launcher's, since it prints every rank's output (mpirun forwards it) ------------
    def logs(self, job_id: str, cursor: Any = None) -> LogChunk:
        _cursor(cursor)  # a cursor we cannot read fails before any API call
        ns = self.namespace
        launcher = _newest_launcher(self.client.list_pods(ns, _pods_selector(job_id)))
        if launcher is None:
            return LogChunk(lines=[], next_cursor=cursor)
        name = launcher["metadata"]["name"]
        try:
            text = self.client.read_pod_log(ns, name)
        except KubernetesApiError as e:
            if e.status in (400, 404):  # container not started yet, or pod just replaced
                return LogChunk(lines=[], next_cursor=cursor)
            raise
        return _chunk(_container_key(launcher), text, cursor)

    async def alogs(self, job_id: str, cursor: Any = None) -> LogChunk:
        _cursor(cursor)
        ns = await self.anamespace()
        launcher = _newest_launcher(await self.client.alist_pods(ns, _pods_selector(job_id)))
        if launcher is None:
            return LogChunk(lines=[], next_cursor=cursor)
        name = launcher["metadata"]["name"]
        try:
            text = await self.client.aread_pod_log(ns, name)
        except KubernetesApiError as e:
            if e.status in (400, 404):
                return LogChunk(lines=[], next_cursor=cursor)
            raise
        return _chunk(_container_key(launcher), text, cursor)

    # -- delete ---------------------------------------------------------------------------------
    def delete(self, job_id: str) -> None:
        ns = self.namespace
        self.client.delete_mpijob(ns, job_id)
        # The garbage collector removes the owned ConfigMap anyway; deleting it here also covers a
        # ConfigMap whose MPIJob never got created.
        self.client.delete_configmap(ns, configmap_name(job_id))

    async def adelete(self, job_id: str) -> None:
        ns = await self.anamespace()
        await self.client.adelete_mpijob(ns, job_id)
        await self.client.adelete_configmap(ns, configmap_name(job_id))


SETTINGS_ENV = "RINGFLOW_MPIJOB_SETTINGS"
CONN_ENV = "RINGFLOW_K8S_CONN_ID"
DEFAULT_CONN_ID = "ringflow_k8s"


def backend_from_env(environ: dict[str, str] | None = None,
                     connections: Connections | None = None) -> MPIJobBackend | None:
    """The MPIJob backend a deployment configured, or None (then DAGs use local workers).

    $RINGFLOW_MPIJOB_SETTINGS holds MPIJobSettings as JSON (deploy/airflow-values.yaml sets it);
    $RINGFLOW_K8S_CONN_ID names the cluster connection `connections` resolves (default "ringflow_k8s").
    """
    import json
    import os

    env = os.environ if environ is None else environ
    raw = (env.get(SETTINGS_ENV) or "").strip()
    if not raw:
        return None
    try:
        settings = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"${SETTINGS_ENV} is not valid JSON ({e}); set it to the MPIJob settings object") from e
    return MPIJobBackend(settings, conn_id=env.get(CONN_ENV) or DEFAULT_CONN_ID, connections=connections)
