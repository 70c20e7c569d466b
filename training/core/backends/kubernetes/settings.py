"""Where and how an MPIJob or a TrainJob runs on the cluster: everything the manifest needs besides the JobSpec,
and how the cluster is reached (ClusterConfig).

Plain JSON in, plain JSON out (`from_dict` / `to_dict`), because the backend travels to the triggerer as
JSON. Every check says what to change.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar, Self

from ringflow.training.formats.engines import DDP, HOROVOD, TENSORFLOW
from ringflow.training.formats.engines import TABLE as ENGINE_TABLE

PLACEMENTS = ("pack", "spread")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
CLEAN_POD_POLICIES = ("None", "Running", "All")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}

# The CRD's pattern for resource quantities (k8s.io/apimachinery resource.Quantity).
_QUANTITY = re.compile(r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$")
_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class SettingsError(ValueError):
    """The MPIJob or TrainJob settings cannot produce a valid job; the message says which setting to fix."""


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """How to reach the cluster (client.py's KubernetesClient): a connection resolves to one
    (backends/connections.py, operators/connections.py)."""

    in_cluster: bool = False
    kubeconfig_path: str | None = None
    kubeconfig: dict[str, Any] | None = None
    context: str | None = None
    namespace: str | None = None


def quantity(value: Any, what: str) -> float:
    """The numeric value of a Kubernetes quantity ("500m", "2Gi"), or SettingsError naming `what`."""
    text = str(value)
    if not _QUANTITY.match(text):
        raise SettingsError(f"{what} is {value!r}; use a Kubernetes quantity such as '500m', '2', '512Mi' or '4Gi'")
    match = re.match(r"^([0-9.]+)(.*)$", text)
    number, suffix = match.group(1), match.group(2)
    if len(suffix) > 1 and suffix[0] in "eE":  # an exponent, not the exa suffix "E"
        return float(text)
    return float(number) * _SUFFIX[suffix]


def _name(value: Any, what: str) -> None:
    if not (isinstance(value, str) and len(value) <= 253 and _DNS_1123_SUBDOMAIN.match(value)):
        raise SettingsError(f"{what} is {value!r}; use a lowercase DNS name (letters, digits, '-', '.')")


@dataclasses.dataclass(frozen=True)
class Resources:
    """Requests (and limits) of one pod.

    memory_limit None means "same as the request": a pod using more than it asked for is the first to be
    OOM-killed, so we make the limit explicit instead. cpu_limit None means no CPU limit: throttling one
    rank slows every rank, since all of them wait for it in each all-reduce.
    """

    cpu: str = "1"
    memory: str = "2Gi"
    cpu_limit: str | None = None
    memory_limit: str | None = None
    gpu: int = 0

    def check(self, what: str) -> None:
        cpu = quantity(self.cpu, f"{what}.cpu")
        memory = quantity(self.memory, f"{what}.memory")
        if memory < 2**20:
            raise SettingsError(f"{what}.memory is {self.memory!r}, under 1Mi; did you forget the unit (e.g. '2Gi')?")
        if self.cpu_limit is not None and quantity(self.cpu_limit, f"{what}.cpu_limit") < cpu:
            raise SettingsError(f"{what}.cpu_limit {self.cpu_limit!r} is below the request {self.cpu!r}; raise it")
        if self.memory_limit is not None and quantity(self.memory_limit, f"{what}.memory_limit") < memory:
            raise SettingsError(
                f"{what}.memory_limit {self.memory_limit!r} is below the request {self.memory!r}; raise it"
            )
        if not isinstance(self.gpu, int) or isinstance(self.gpu, bool) or self.gpu < 0:
            raise SettingsError(f"{what}.gpu is {self.gpu!r}; use a whole number of GPUs >= 0")

    def to_k8s(self) -> dict[str, Any]:
        requests: dict[str, Any] = {"cpu": str(self.cpu), "memory": str(self.memory)}
        limits: dict[str, Any] = {"memory": str(self.memory_limit or self.memory)}
        if self.cpu_limit is not None:
            limits["cpu"] = str(self.cpu_limit)
        if self.gpu:
            # Extended resources are limits only; the request defaults to the limit.
            limits["nvidia.com/gpu"] = self.gpu
        return {"requests": requests, "limits": limits}


@dataclasses.dataclass(frozen=True)
class RunPolicy:
    """The MPIJob runPolicy.

    backoff_limit 1: one launcher retry absorbs a launch race (a worker's sshd not answering yet); more
    retries would only repeat what Airflow's own task retries already do.
    ttl_seconds_after_finished: keep the finished job (and the launcher's log) for a day, then let the
    cluster clean up.
    """

    clean_pod_policy: str = "Running"
    backoff_limit: int | None = 1
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = 86400

    def check(self) -> None:
        if self.clean_pod_policy not in CLEAN_POD_POLICIES:
            raise SettingsError(
                f"run_policy.clean_pod_policy is {self.clean_pod_policy!r}; use one of {CLEAN_POD_POLICIES}"
            )
        for name, minimum in (("backoff_limit", 0), ("active_deadline_seconds", 1), ("ttl_seconds_after_finished", 0)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < minimum):
                raise SettingsError(f"run_policy.{name} is {value!r}; use a whole number >= {minimum}, or null")

    def to_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cleanPodPolicy": self.clean_pod_policy}
        for name, key in (("backoff_limit", "backoffLimit"), ("active_deadline_seconds", "activeDeadlineSeconds"),
                          ("ttl_seconds_after_finished", "ttlSecondsAfterFinished")):
            if getattr(self, name) is not None:
                out[key] = getattr(self, name)
        return out


@dataclasses.dataclass(frozen=True)
class PodSettings:
    """The settings both job kinds share (the same field names, the same meaning and checks); a kind's
    settings add their own fields after these.

    image: the training image (docker/training.Dockerfile), pinned to a tag or digest.
    namespace: None means the Airflow connection's namespace, else "default".
    worker: requests and limits of each pod that hosts ranks.
    placement: "pack" prefers putting workers on as few nodes as possible (fast local all-reduce),
      "spread" prefers one worker per node (a node failure takes fewer workers; more memory bandwidth).
    s3_secret_name: a Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the MinIO credentials);
      pods read it through secretKeyRef, so no credential ever appears in the manifest.
    s3_endpoint: the MinIO URL (not a secret), passed as RINGFLOW_S3_ENDPOINT.
    """

    image: str
    namespace: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    worker: Resources = dataclasses.field(default_factory=Resources)
    placement: str = "pack"
    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    s3_secret_name: str | None = None
    s3_endpoint: str | None = None
    service_account: str | None = None
    python: str = "python"

    # The fields that hold nested settings, built from their JSON mappings in this order.
    _nested: ClassVar[tuple[tuple[str, type], ...]] = (("worker", Resources),)

    def __post_init__(self) -> None:
        _coerce(self, self._nested)
        _check_pod_settings(self)
        self._check()

    def _check(self) -> None:
        """The kind's own checks, after the shared ones."""

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return _build(cls, data, "settings")


@dataclasses.dataclass(frozen=True)
class MPIJobSettings(PodSettings):
    """Cluster-side settings of the training MPIJobs: PodSettings, and

    launcher: the launcher pod's requests and limits (mpirun only: small).
    run_as_root: the image runs as mpiuser (uid run_as_user) by default; root also needs mpirun's
      --allow-run-as-root and the SSH keys in /root/.ssh.
    ssh_port: where the workers' sshd listens (the image's sshd config); checked by the readiness probe, so
      "workers ready" means "sshd answers" before the launcher starts.
    """

    image_pull_policy: str = "IfNotPresent"
    launcher: Resources = dataclasses.field(default_factory=lambda: Resources(cpu="250m", memory="512Mi"))
    run_policy: RunPolicy = dataclasses.field(default_factory=RunPolicy)
    run_as_root: bool = False
    run_as_user: int = 1000
    ssh_auth_mount_path: str | None = None
    ssh_port: int = 2222

    _nested: ClassVar[tuple[tuple[str, type], ...]] = (("worker", Resources), ("launcher", Resources),
                                                       ("run_policy", RunPolicy))

    def _check(self) -> None:
        if self.image_pull_policy not in PULL_POLICIES:
            raise SettingsError(f"image_pull_policy is {self.image_pull_policy!r}; use one of {PULL_POLICIES}")
        self.launcher.check("launcher")
        self.run_policy.check()
        if not isinstance(self.run_as_root, bool):
            raise SettingsError("run_as_root must be true or false")
        if not isinstance(self.run_as_user, int) or isinstance(self.run_as_user, bool) or self.run_as_user < 1:
            raise SettingsError(f"run_as_user is {self.run_as_user!r}; use the image's non-root uid (1000)")
        path = self.ssh_auth_mount_path
        if path is not None and not (isinstance(path, str) and path.startswith("/")):
            raise SettingsError(f"ssh_auth_mount_path is {path!r}; use an absolute path such as /home/mpiuser/.ssh")
        if not isinstance(self.ssh_port, int) or not 0 < self.ssh_port < 65536:
            raise SettingsError(f"ssh_port is {self.ssh_port!r}; use the port the image's sshd listens on (2222)")

    @property
    def ssh_path(self) -> str:
        """Where the MPI Operator mounts the SSH keys: the home of the user the pods run as."""
        if self.ssh_auth_mount_path:
            return self.ssh_auth_mount_path
        return "/root/.ssh" if self.run_as_root else "/home/mpiuser/.ssh"


def _check_pod_settings(s: PodSettings) -> None:
    """The checks of the settings both job kinds share."""
    image = s.image
    if not isinstance(image, str) or not image or any(c.isspace() for c in image):
        raise SettingsError(f"image is {image!r}; set it to the training image, e.g. 'registry/ringflow-training:0.1.0'")
    last = image.rsplit("/", 1)[-1]
    if "@" not in image and (":" not in last or last.endswith(":latest")):
        raise SettingsError(
            f"image {image!r} is not pinned; add a version tag or a digest (not ':latest') so that every "
            "worker and every retry runs the same code"
        )
    if s.namespace is not None:
        _name(s.namespace, "namespace")
    for secret in s.image_pull_secrets:
        _name(secret, "an image_pull_secrets entry")
    s.worker.check("worker")
    if s.placement not in PLACEMENTS:
        raise SettingsError(f"placement is {s.placement!r}; use 'pack' or 'spread'")
    if not isinstance(s.node_selector, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in s.node_selector.items()
    ):
        raise SettingsError("node_selector must map label keys to label values (strings)")
    for toleration in s.tolerations:
        if not isinstance(toleration, dict) or not toleration or set(toleration) - TOLERATION_KEYS:
            raise SettingsError(
                f"toleration {toleration!r} must be a mapping with only the keys {sorted(TOLERATION_KEYS)}"
            )
    for name in ("s3_secret_name", "service_account"):
        if getattr(s, name) is not None:
            _name(getattr(s, name), name)
    if s.s3_endpoint is not None and not re.match(r"^https?://[^\s]+$", str(s.s3_endpoint)):
        raise SettingsError(f"s3_endpoint is {s.s3_endpoint!r}; use a URL such as 'http://minio.ringflow:9000'")
    if not isinstance(s.python, str) or not s.python:
        raise SettingsError("python must name the interpreter in the image, e.g. 'python'")


def _coerce(s: Any, nested: tuple[tuple[str, type], ...]) -> None:
    # Accept the JSON shapes (dicts, lists) so that Settings(**json.loads(...)) just works.
    for name, cls in nested:
        value = getattr(s, name)
        if isinstance(value, dict):
            object.__setattr__(s, name, _build(cls, value, name))
        elif not isinstance(value, cls):
            raise SettingsError(f"{name} must be a mapping of {_fields(cls)}")
    for name in ("image_pull_secrets", "tolerations"):
        value = getattr(s, name)
        if isinstance(value, (list, tuple)):
            object.__setattr__(s, name, tuple(value))
        else:
            raise SettingsError(f"{name} must be a list")


@dataclasses.dataclass(frozen=True)
class TrainJobSettings(PodSettings):
    """Cluster-side settings of the training TrainJobs (Kubeflow Trainer v2, trainer.kubeflow.org/v1alpha1).

    PodSettings, as for an MPIJob where the TrainJob can carry them; what a TrainJob cannot set (the
    workers' image pull policy, ssh port and user, the retry count, the TTL) lives in ringflow's
    ClusterTrainingRuntimes (deploy/trainer/), which these settings name.

    image: the training image. Every pod of a DDP or TensorFlow job runs it; in a Horovod job the launcher
      runs it and the nodes run the image of the `ringflow-horovod` runtime (a TrainJob cannot set it): keep
      both equal.
    worker: requests and limits of every node (TrainJob resourcesPerNode); the Horovod launcher is a node too
      (the runtime's runLauncherAsNode), so there is no separate launcher size.
    active_deadline_seconds: the TrainJob's own deadline, the backstop when Airflow is gone.
    horovod_runtime, ddp_runtime, tensorflow_runtime: the ClusterTrainingRuntimes that run each engine.
    tensorflow_python: the TF venv's interpreter in the image (docker/training.Dockerfile's /opt/tensorflow):
      TensorFlow lives in a venv of its own, beside `python`'s torch one.
    """

    active_deadline_seconds: int | None = None
    horovod_runtime: str = ENGINE_TABLE[HOROVOD].trainjob_runtime
    ddp_runtime: str = ENGINE_TABLE[DDP].trainjob_runtime
    tensorflow_runtime: str = ENGINE_TABLE[TENSORFLOW].trainjob_runtime
    tensorflow_python: str = "/opt/tensorflow/bin/python"

    def _check(self) -> None:
        deadline = self.active_deadline_seconds
        if deadline is not None and (not isinstance(deadline, int) or isinstance(deadline, bool) or deadline < 1):
            raise SettingsError(f"active_deadline_seconds is {deadline!r}; use a whole number >= 1, or null")
        for name in (e.trainjob_runtime_setting for e in ENGINE_TABLE.values()):
            if hasattr(self, name):
                _name(getattr(self, name), name)
        if not (isinstance(self.tensorflow_python, str) and self.tensorflow_python.startswith("/")):
            raise SettingsError(f"tensorflow_python is {self.tensorflow_python!r}; give the absolute path of the "
                                "TF venv's interpreter in the image, e.g. '/opt/tensorflow/bin/python'")

    def runtime(self, engine: str) -> str:
        """The ClusterTrainingRuntime that runs this engine."""
        # An engine without a settings field of its own runs on the table's runtime.
        spec = ENGINE_TABLE[engine]
        return getattr(self, spec.trainjob_runtime_setting, spec.trainjob_runtime)


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _build(cls: type, data: dict[str, Any], what: str) -> Any:
    if not isinstance(data, dict):
        raise SettingsError(f"{what} must be a mapping of {_fields(cls)}")
    unknown = set(data) - set(_fields(cls))
    if unknown:
        raise SettingsError(f"{what} has unknown keys {sorted(unknown)}; valid keys are {_fields(cls)}")
    if issubclass(cls, PodSettings) and "image" not in data:
        raise SettingsError("settings.image is missing; set it to the training image")
    return cls(**data)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
