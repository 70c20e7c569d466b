"""Pure functions from a JobSpec and MPIJobSettings to the Kubernetes objects of one training run.

Two objects: a ConfigMap with the job config (mounted at /etc/ringflow in every pod) and a
`kubeflow.org/v2beta1` MPIJob (kubeflow/mpi-operator v0.8.2). The operator adds the hostfile, the SSH
keys and its own labels; everything else is here, so the snapshot tests show exactly what is submitted.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ringflow.training.backends.job_spec import JobSpec, JobSpecError
from ringflow.training.backends.kubernetes import labels as L
from ringflow.training.backends.kubernetes.settings import MPIJobSettings, Resources, RunPolicy, SettingsError
from ringflow.training.store.s3 import ACCESS_KEY_VAR, ENDPOINT_VAR, SECRET_KEY_VAR

__all__ = [
    "API_VERSION", "KIND", "CONFIG_MOUNT_PATH", "CONFIG_FILE", "S3_SECRET_KEYS", "S3_ENDPOINT_ENV",
    "MPIJobSettings", "Resources", "RunPolicy", "SettingsError",
    "build_mpijob", "build_configmap", "configmap_name", "mpirun_command",
]

# The MPIJob CRD (kubeflow/mpi-operator v0.8.2), for the manifests here and the API calls in client.py.
GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MPIJob"
CONFIG_MOUNT_PATH = "/etc/ringflow"
CONFIG_FILE = "job.json"
CONFIG_VOLUME = "ringflow-job"
# The variables the ranks' S3 store reads (training/store/s3.py): the two from the Secret, the endpoint as is.
S3_SECRET_KEYS = (ACCESS_KEY_VAR, SECRET_KEY_VAR)
S3_ENDPOINT_ENV = ENDPOINT_VAR
# Always forwarded to every rank: ranks start through ssh with a bare environment otherwise.
FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def configmap_name(job_name: str) -> str:
    # Not "<name>-config": the MPI Operator already creates that one (hostfile, discover_hosts.sh).
    return f"{job_name}-ringflow"


def _check_env(spec: JobSpec, settings: MPIJobSettings) -> None:
    reserved = set(FORWARDED_ENV) | set(S3_SECRET_KEYS) | {S3_ENDPOINT_ENV}
    for name in spec.env:
        if not _ENV_NAME.match(name):
            raise JobSpecError(f"env name {name!r} is not a valid variable name; use letters, digits and '_'")
        if name in S3_SECRET_KEYS:
            raise JobSpecError(
                f"env sets {name}; credentials never go into the job spec: set the backend's s3_secret_name instead"
            )
        if name in reserved:
            raise JobSpecError(f"env sets {name}, which the backend manages; remove it from the job spec")


def _check_engine(spec: JobSpec) -> None:
    # An MPIJob runs mpirun over the workers' sshd: that launches Horovod ranks, never torchrun's.
    engine = spec.config.get("engine", "horovod") if isinstance(spec.config, dict) else "horovod"
    if engine != "horovod":
        raise JobSpecError(
            f"engine {engine!r} cannot run as an MPIJob: an MPIJob launches Horovod ranks with mpirun. Until the "
            f"TrainJob backend exists (issue 10), run the DDP engine with the local backend (unset "
            f"$RINGFLOW_MPIJOB_SETTINGS, or pass backend=LocalProcessBackend()), or set engine to \"horovod\" to "
            f"train on Kubernetes"
        )


def _check_name(spec: JobSpec) -> None:
    # The MPI Operator's own validation (v0.8.2 validation.go): every worker's hostname
    # "<name>-worker-<i>" must be a DNS-1035 label, else it rejects the job after we submitted it.
    longest = f"{spec.name}-worker-{spec.num_workers - 1}"
    if len(longest) > 63 or not re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", longest):
        raise JobSpecError(
            f"job name {spec.name!r} cannot be an MPIJob name with {spec.num_workers} workers: the pod hostname "
            f"{longest!r} must start with a letter and have at most 63 characters; use a shorter name"
        )


def mpirun_command(spec: JobSpec, settings: MPIJobSettings) -> list[str]:
    """The launcher's command line. The MPI Operator provides the hostfile (OMPI_MCA_orte_default_hostfile)."""
    cmd = ["mpirun", "-np", str(spec.world_size)]
    if settings.run_as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["-bind-to", "none", "-map-by", "slot"]
    for name in _forwarded_env(spec, settings):
        cmd += ["-x", name]
    # ob1 over TCP: no InfiniBand assumed; excluding openib silences its probe warnings on plain nodes.
    cmd += ["-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    cmd += [settings.python, "-m", "ringflow.training", f"{CONFIG_MOUNT_PATH}/{CONFIG_FILE}"]
    return cmd


def _forwarded_env(spec: JobSpec, settings: MPIJobSettings) -> list[str]:
    names = list(FORWARDED_ENV)
    if settings.s3_secret_name:
        names += list(S3_SECRET_KEYS)
    if settings.s3_endpoint:
        names.append(S3_ENDPOINT_ENV)
    return names + sorted(spec.env)


def _launcher_env(spec: JobSpec, settings: MPIJobSettings) -> list[dict[str, Any]]:
    # PYTHONPATH and LD_LIBRARY_PATH must exist for `-x` (the image sets them); only the launcher gets the
    # credentials, and mpirun hands them to the ranks, so worker pods (sshd only) never hold them.
    env: list[dict[str, Any]] = []
    if settings.s3_secret_name:
        for key in S3_SECRET_KEYS:
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": settings.s3_secret_name, "key": key}}})
    if settings.s3_endpoint:
        env.append({"name": S3_ENDPOINT_ENV, "value": settings.s3_endpoint})
    env += [{"name": k, "value": str(v)} for k, v in sorted(spec.env.items())]
    return env


def _security_context(settings: MPIJobSettings) -> dict[str, Any]:
    if settings.run_as_root:
        return {"runAsUser": 0}
    return {"runAsUser": settings.run_as_user, "runAsGroup": settings.run_as_user, "runAsNonRoot": True}


def _config_mount() -> dict[str, Any]:
    return {"name": CONFIG_VOLUME, "mountPath": CONFIG_MOUNT_PATH, "readOnly": True}


def _pod_spec(spec: JobSpec, settings: MPIJobSettings, container: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": CONFIG_VOLUME, "configMap": {"name": configmap_name(spec.name)}}],
    }
    if settings.service_account:
        pod["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if settings.node_selector:
        pod["nodeSelector"] = dict(sorted(settings.node_selector.items()))
    if settings.tolerations:
        pod["tolerations"] = [dict(t) for t in settings.tolerations]
    return pod


def _worker_affinity(spec: JobSpec, settings: MPIJobSettings) -> dict[str, Any]:
    # Preferred, not required: a required rule makes the job unschedulable when there are fewer (or more)
    # nodes than the rule assumes; preferred still packs or spreads whenever the cluster allows.
    term = {
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {L.JOB_NAME_LABEL: spec.name, L.JOB_ROLE_LABEL: "worker"}},
            "topologyKey": "kubernetes.io/hostname",
        },
    }
    kind = "podAffinity" if settings.placement == "pack" else "podAntiAffinity"
    return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}


def _template(labels: dict[str, str], pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels)}, "spec": pod_spec}


def _metadata(name: str, spec: JobSpec, settings: MPIJobSettings) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": L.job_labels(spec.labels),
        "annotations": {L.ORIGINAL_LABELS_ANNOTATION: L.original_labels_annotation(spec.labels)},
    }
    if settings.namespace:
        meta["namespace"] = settings.namespace
    return meta


def build_configmap(spec: JobSpec, settings: MPIJobSettings) -> dict[str, Any]:
    """The ConfigMap holding JobSpec.config as /etc/ringflow/job.json."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(configmap_name(spec.name), spec, settings),
        "data": {CONFIG_FILE: json.dumps(spec.config, sort_keys=True, indent=2) + "\n"},
    }


def build_mpijob(spec: JobSpec, settings: MPIJobSettings) -> dict[str, Any]:
    """The MPIJob for this spec: one launcher running mpirun, spec.num_workers workers running sshd."""
    if not isinstance(settings, MPIJobSettings):
        raise SettingsError("settings must be an MPIJobSettings (use MPIJobSettings.from_dict for JSON)")
    _check_engine(spec)
    _check_name(spec)
    _check_env(spec, settings)
    labels = L.job_labels(spec.labels)
    command = mpirun_command(spec, settings)
    launcher = {
        "name": "launcher",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command[:1],
        "args": command[1:],
        "env": _launcher_env(spec, settings),
        "resources": settings.launcher.to_k8s(),
        "securityContext": _security_context(settings),
        # mpirun's last lines become the termination message: outcome.py reads ssh/ORTE errors from it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [_config_mount()],
    }
    sshd = ["/usr/sbin/sshd", "-De"]
    if not settings.run_as_root:
        sshd += ["-f", "/home/mpiuser/.sshd_config"]
    worker = {
        "name": "worker",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": sshd[:1],
        "args": sshd[1:],
        "resources": settings.worker.to_k8s(),
        "securityContext": _security_context(settings),
        "ports": [{"name": "ssh", "containerPort": settings.ssh_port, "protocol": "TCP"}],
        # Ready means sshd answers, so WaitForWorkersReady really waits until mpirun can connect.
        "readinessProbe": {"tcpSocket": {"port": settings.ssh_port}, "periodSeconds": 2, "failureThreshold": 3},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [_config_mount()],
    }
    worker_pod = _pod_spec(spec, settings, worker)
    worker_pod["affinity"] = _worker_affinity(spec, settings)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _metadata(spec.name, spec, settings),
        "spec": {
            "slotsPerWorker": spec.slots_per_worker,
            "runPolicy": settings.run_policy.to_k8s(),
            "sshAuthMountPath": settings.ssh_path,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    # OnFailure: the launcher Job retries mpirun in place, up to runPolicy.backoffLimit.
                    "restartPolicy": "OnFailure",
                    "template": _template(labels, _pod_spec(spec, settings, launcher)),
                },
                "Worker": {
                    "replicas": spec.num_workers,
                    # The operator never recreates a failed worker pod; restarting it in place lets a
                    # launcher retry find every worker again.
                    "restartPolicy": "OnFailure",
                    "template": _template(labels, worker_pod),
                },
            },
        },
    }
