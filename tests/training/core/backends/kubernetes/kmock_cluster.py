"""A Kubernetes API emulator (kmock) on 127.0.0.1, for tests that use the real `kubernetes` clients.

kmock's KubernetesEmulator stores objects as plain JSON and serves create/get/list/delete. It runs on its
own event loop in a background thread, because the code under test makes blocking (sync) calls; tests
change the cluster through `Cluster` methods, which run on that loop.

Where the emulator is simpler than a real API server, `FaithfulEmulator` fills in what the backend relies
on: server-set metadata (uid, creationTimestamp, resourceVersion), label selectors on lists, and foreground
deletion (kmock removes an object at once and never its dependents; see `_begin_foreground_delete`).
"""
from __future__ import annotations

import asyncio
import datetime
import itertools
import pathlib
import threading
import uuid
from typing import Any, Callable

import kmock
import yaml

MPIJOBS = "kubeflow.org/v2beta1/mpijobs"
TRAINJOBS = "trainer.kubeflow.org/v1alpha1/trainjobs"
PODS = "v1/pods"
CONFIGMAPS = "v1/configmaps"
NODES = "v1/nodes"
# The label each job kind's operator puts on every pod of a job, valued with the job's name: the MPI
# Operator's, and the JobSet's (a TrainJob's JobSet is named like it).
JOB_POD_LABELS = {MPIJOBS: "training.kubeflow.org/job-name", TRAINJOBS: "jobset.sigs.k8s.io/jobset-name"}
# Kinds whose CRD enables the status subresource (both do: subresources.status in their CRDs).
STATUS_SUBRESOURCE = (MPIJOBS, TRAINJOBS)


def _matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FaithfulEmulator(kmock.KubernetesEmulator):
    _clock = itertools.count(1)
    # How long a job's pods take to terminate once the job is deleted (the kubelet's grace period, scaled
    # down); None: they never do (a pod on a lost node, or held by a finalizer).
    pod_termination_seconds: float | None = 0.0

    async def _handle(self, request: kmock.Request):  # type: ignore[override]
        if request.action == kmock.action.UPDATE and isinstance(request.data, dict) \
                and request.resource in {kmock.resource(r) for r in STATUS_SUBRESOURCE}:
            self._keep_to_subresource(request)
        if request.action == kmock.action.DELETE and request.name is not None:
            self._begin_foreground_delete(request)
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("namespace", request.namespace)
            # What a real API server adds; the backend needs the uid for owner references.
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("resourceVersion", str(next(self._clock)))
            now = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(microseconds=next(self._clock))
            meta.setdefault("creationTimestamp", now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        return await super()._handle(request)

    @staticmethod
    def _keep_to_subresource(request: kmock.Request) -> None:
        """What a real API server does for a kind whose CRD enables the status subresource (kmock applies any patch
        whole): a write to .../status changes the status and nothing else, a write to the object itself everything
        but the status."""
        data = request.data
        if request.subresource == "status":
            kept = {"status": data["status"]} if "status" in data else {}
        else:
            kept = {k: v for k, v in data.items() if k != "status"}
        data.clear()
        data.update(kept)

    def _begin_foreground_delete(self, request: kmock.Request) -> None:
        """What a real API server does with a job deleted with propagationPolicy Foreground: the job stays,
        with a deletionTimestamp and the foregroundDeletion finalizer, while the garbage collector deletes
        its dependents (its pods terminate); the job goes last. Its dependents here are the pods carrying its
        operator's name label (the real collector follows their ownerReferences) and the ConfigMaps it owns."""
        label = next((label for resource, label in JOB_POD_LABELS.items()
                      if request.resource == kmock.resource(resource)), None)
        if label is None or (request.data or {}).get("propagationPolicy") != "Foreground":
            return
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return
        meta = self.objects[key].get("metadata", {})
        if meta.get("deletionTimestamp"):
            return  # already being deleted
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.objects[key].patch({"metadata": {"deletionTimestamp": now, "finalizers": ["foregroundDeletion"]}})
        asyncio.get_running_loop().create_task(self._collect_garbage(key, label, now))

    async def _collect_garbage(self, job: Any, label: str, now: str) -> None:
        _resource, namespace, name = job
        pods = [key for key, obj in self.objects.items() if key[0] == kmock.resource(PODS) and key[1] == namespace
                and not obj.deleted and (obj.get("metadata", {}).get("labels") or {}).get(label) == name]
        for key in pods:
            self.objects[key].patch({"metadata": {"deletionTimestamp": now}})  # Terminating
        if self.pod_termination_seconds is None:
            return  # stuck: the pods, and so the job, stay
        await asyncio.sleep(self.pod_termination_seconds)
        owned = [key for key, obj in self.objects.items() if key[0] == kmock.resource(CONFIGMAPS) and not obj.deleted
                 and any(ref.get("name") == name for ref in obj.get("metadata", {}).get("ownerReferences") or [])]
        for key in pods + owned:
            if not self.objects[key].deleted:
                self.objects[key].delete()
        if not self.objects[job].deleted:
            self.objects[job].delete()  # the finalizer's work is done: the job goes

    async def _serve_list(self, request: kmock.Request):  # type: ignore[override]
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            result["items"] = [i for i in result["items"]
                               if _matches(selector, (i.get("metadata") or {}).get("labels") or {})]
        return result


class Cluster:
    """The running emulator, its URL and a kubeconfig for it, and helpers to script the cluster."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.logs: dict[tuple[str, str], str] = {}
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"kmock did not start: {self._error!r}")
        if self._error:
            raise self._error
        self.kubeconfig = tmp / "kubeconfig.yaml"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        }))

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # surfaced by __init__ when it happens at start
            self._error = e
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with FaithfulEmulator() as k, kmock.Server(k, host="127.0.0.1") as server:
            self.k = k
            self.url = str(server.url).rstrip("/")
            for resource in (MPIJOBS, TRAINJOBS, PODS, CONFIGMAPS, NODES):
                k.resources[resource] = {}
            # The log subresource is not an object: serve the text the test scripted for that pod.
            k["get", kmock.resource(PODS), kmock.subresource("log")] << self._serve_log
            self._ready.set()
            await self._stop.wait()

    def _serve_log(self, request: kmock.Request) -> Any:
        key = (request.namespace, request.name)
        if key not in self.logs:
            # What the API server answers while the container is not running yet.
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=(
                f'container "launcher" in pod "{request.name}" is waiting to start: ContainerCreating'))
        return self.logs[key].encode()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the emulator's loop (where its state lives) and return what it returns."""
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    # -- scripting the cluster ------------------------------------------------------------------
    def put(self, resource: str, namespace: str, name: str, obj: dict[str, Any]) -> None:
        obj = dict(obj)
        obj.setdefault("metadata", {}).update(name=name, namespace=namespace)
        self.call(lambda: self.k.objects.__setitem__((kmock.resource(resource), namespace, name), obj))

    def add_node(self, name: str, *, ready: bool = True, unschedulable: bool = False,
                 labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> None:
        """A node as the kubelet reports it (its Ready condition) and as an admin may cordon or taint it."""
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
                "spec": {"unschedulable": unschedulable, "taints": taints or []},
                "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        self.call(lambda: self.k.objects.__setitem__((kmock.resource(NODES), None, name), node))

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        def read() -> Any:
            key = (kmock.resource(resource), namespace, name)
            if key not in self.k.objects or self.k.objects[key].deleted:
                return None
            return dict(self.k.objects[key].raw)
        return self.call(read)

    def patch(self, resource: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.call(lambda: self.k.objects[kmock.resource(resource), namespace, name].patch(patch))

    def set_conditions(self, namespace: str, name: str, *conditions: tuple[str, str, str],
                       resource: str = MPIJOBS) -> None:
        """What the MPI Operator (or Kubeflow Trainer, resource=TRAINJOBS) writes into status: (type, reason,
        message) conditions, all True."""
        conds = [{"type": t, "status": "True", "reason": r, "message": m,
                  "lastTransitionTime": "2030-01-01T00:00:00Z"} for t, r, m in conditions]
        self.patch(resource, namespace, name, {"status": {"conditions": conds}})

    def add_jobset_pod(self, namespace: str, job: str, replicated_job: str, index: int = 0, *,
                       status: dict[str, Any], restart: int = 0, created: str = "2030-01-01T00:00:00Z") -> str:
        """A pod of a TrainJob's JobSet as the JobSet and Job controllers make it (name and labels)."""
        name = f"{job}-{replicated_job}-0-{index}-r{restart}x"
        self.put(PODS, namespace, name, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created, "labels": {
                "jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
                "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/restart-attempt": str(restart),
                "batch.kubernetes.io/job-completion-index": str(index)}},
            "spec": {"containers": [{"name": "node", "image": "registry.example/ringflow-training:0.1.0",
                                     "resources": {"limits": {"memory": "2Gi"}}}]},
            "status": status,
        })
        return name

    def add_pod(self, namespace: str, job: str, role: str, index: int = 0, *, status: dict[str, Any],
                created: str = "2030-01-01T00:00:00Z") -> str:
        """A pod as the MPI Operator makes it (its labels), with the given status."""
        name = f"{job}-{role}-{index}" if role == "worker" else f"{job}-launcher-{index}"
        self.put(PODS, namespace, name, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created, "labels": {
                "training.kubeflow.org/job-name": job, "training.kubeflow.org/job-role": role,
                "training.kubeflow.org/operator-name": "mpi-operator"}},
            "spec": {"containers": [{"name": role, "image": "registry.example/ringflow-training:0.1.0",
                                     "resources": {"limits": {"memory": "2Gi"}}}]},
            "status": status,
        })
        return name

    def set_pod_termination(self, seconds: float | None) -> None:
        """How long the job's pods take to terminate after a foreground delete; None: forever."""
        self.k.pod_termination_seconds = seconds

    def requests(self, method: str | None = None, resource: str | None = None) -> list[kmock.Request]:
        def read() -> list[kmock.Request]:
            view = self.k
            if method:
                view = view[method]
            if resource:
                view = view[kmock.resource(resource)]
            return list(view)
        return self.call(read)

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()
