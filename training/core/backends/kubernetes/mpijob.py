"""Pure functions from a JobSpec and MPIJobSettings to the Kubernetes objects of one training run.

Two objects: a ConfigMap with the job config (mounted at /etc/ringflow in every pod) and a
`kubeflow.org/v2beta1` MPIJob (kubeflow/mpi-operator v0.8.2). The operator adds the hostfile, the SSH
keys and its own labels; everything else is here, so the snapshot tests show exactly what is submitted.
"""
from __future__ import annotations

import os
from typing import Any

from ..job_spec import JobSpec, JobSpecError
from . import job_parts as P
from . import labels as L
from .job_parts import (CONFIG_FILE, CONFIG_MOUNT_PATH, FORWARDED_ENV,
                                                             S3_ENDPOINT_ENV, S3_SECRET_KEYS, build_configmap,
                                                             configmap_name)
from .settings import MPIJobSettings, Resources, RunPolicy, SettingsError
from ringflow.training.core.elastic_hosts import elastic_arguments
from ringflow.training.formats.config import ConfigError, ElasticConfig
from ringflow.training.formats.engines import DEFAULT_ENGINE, MPIJOB, EngineError, check_backend, check_elastic_backend

__all__ = [
    "API_VERSION", "KIND", "CONFIG_MOUNT_PATH", "CONFIG_FILE", "S3_SECRET_KEYS", "S3_ENDPOINT_ENV", "FORWARDED_ENV",
    "MPIJobSettings", "Resources", "RunPolicy", "SettingsError",
    "build_mpijob", "build_configmap", "configmap_name", "mpirun_command",
    "DISCOVER_HOSTS_SCRIPT",
]

# The MPIJob CRD (kubeflow/mpi-operator v0.8.2), for the manifests here and the API calls in client.py.
GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MPIJob"


def _check_engine(spec: JobSpec) -> None:
    # An MPIJob runs mpirun over the workers' sshd: it launches only the engines whose pods start that way
    # (the engine table). The operator checks this before launch too; here it guards any other caller.
    try:
        check_backend(spec.config.get("engine", DEFAULT_ENGINE), MPIJOB)
        check_elastic_backend(spec.config.get("elastic") is not None, MPIJOB)
    except EngineError as e:
        raise JobSpecError(str(e)) from None


def _check_name(spec: JobSpec) -> None:
    # The MPI Operator's own validation (v0.8.2 validation.go): every worker's hostname
    # "<name>-worker-<i>" must be a DNS-1035 label, else it rejects the job after we submitted it.
    P.check_hostname(spec, f"{spec.name}-worker-{spec.num_workers - 1}", "an MPIJob")


def mpirun_command(spec: JobSpec, settings: MPIJobSettings) -> list[str]:
    """The launcher's command line. The MPI Operator provides the hostfile (OMPI_MCA_orte_default_hostfile)."""
    names = list(FORWARDED_ENV) + P.store_env_names(settings) + sorted(spec.env)
    return P.mpirun_command(spec.num_workers, names, settings.python, settings.run_as_root)


# What the MPI Operator (v0.8.2, updateDiscoverHostsInConfigMap) mounts beside the hostfile, mode 0555: a script
# that prints one line per worker pod now Running (`echo <pod>.<job>-worker.<ns>.svc`, no slots), rewritten as
# pods start and stop. Horovod elastic's host discovery for an MPIJob (the operator's own elastic example).
DISCOVER_HOSTS_SCRIPT = "/etc/mpi/discover_hosts.sh"


def elastic(spec: JobSpec) -> ElasticConfig | None:
    """The job's `elastic` section, checked (the ranks check the whole config again)."""
    doc = spec.config.get("elastic")
    if doc is None:
        return None
    try:
        recovery = ElasticConfig.from_dict(doc)
    except ConfigError as e:
        raise JobSpecError(str(e)) from None
    if spec.num_workers < 2:
        # Horovod 0.28.1's elastic driver waits for two hosts before it starts when it probes their network
        # interfaces (gloo_run._get_min_start_hosts): one worker pod would wait for ever.
        raise JobSpecError(f"elastic is set on an MPIJob of {spec.num_workers} worker: Horovod's elastic driver "
                           "starts only with two worker pods or more; use num_workers >= 2, or remove elastic")
    return recovery


def horovodrun_elastic_command(spec: JobSpec, settings: MPIJobSettings, recovery: ElasticConfig) -> list[str]:
    """The launcher's command line for a job with `elastic` (rank/elastic.py): Horovod's elastic driver with
    the Gloo controller, over the worker pods the operator's discovery script lists, one slot each, started
    over ssh on the workers' sshd port as mpirun would reach them. horovodrun hands its whole environment to
    the ranks (the store's credentials among it) on each rank's ssh command line, where mpirun's -x passes
    variables by name: inside the pods, the process list shows them. Its own interface probe finds the pods'
    network (no --network-interface: a pod's is not known here), which needs two worker pods to start."""
    python = settings.python
    horovodrun = os.path.join(os.path.dirname(python), "horovodrun") if "/" in python else "horovodrun"
    return [horovodrun, "-np", str(spec.num_workers), "--gloo",
            *elastic_arguments(recovery, spec.num_workers, DISCOVER_HOSTS_SCRIPT),
            "--slots-per-host", "1", "--ssh-port", str(settings.ssh_port),
            python, "-m", "ringflow.training", P.config_path()]


def _launcher_env(spec: JobSpec, settings: MPIJobSettings) -> list[dict[str, Any]]:
    # PYTHONPATH and LD_LIBRARY_PATH must exist for `-x` (the image sets them); only the launcher gets the
    # credentials, and mpirun hands them to the ranks, so worker pods (sshd only) never hold them.
    return P.store_env(settings) + P.plain_env(spec.env)


def _security_context(settings: MPIJobSettings) -> dict[str, Any]:
    if settings.run_as_root:
        return {"runAsUser": 0}
    return {"runAsUser": settings.run_as_user, "runAsGroup": settings.run_as_user, "runAsNonRoot": True}


def _pod_spec(spec: JobSpec, settings: MPIJobSettings, container: dict[str, Any]) -> dict[str, Any]:
    return {"containers": [container], "volumes": [P.config_volume(spec.name)], **P.pod_settings(settings)}


def _worker_affinity(spec: JobSpec, settings: MPIJobSettings) -> dict[str, Any]:
    return P.placement_affinity(settings.placement, {L.JOB_NAME_LABEL: spec.name, L.JOB_ROLE_LABEL: "worker"})


def _template(labels: dict[str, str], pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels)}, "spec": pod_spec}


def _container(name: str, command: list[str], settings: MPIJobSettings, resources: Any) -> dict[str, Any]:
    """What the launcher's and the workers' containers share: the image, the command, the resources, the job
    config mounted, and the last lines of the log as the termination message (mpijob_outcome.py reads ssh/ORTE errors
    from the launcher's)."""
    return {"name": name, "image": settings.image, "imagePullPolicy": settings.image_pull_policy,
            "command": command[:1], "args": command[1:], "resources": resources.to_k8s(),
            "securityContext": _security_context(settings), "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [P.config_mount()]}


def build_mpijob(spec: JobSpec, settings: MPIJobSettings) -> dict[str, Any]:
    """The MPIJob for this spec: one launcher running mpirun (Horovod's elastic driver with `elastic`),
    spec.num_workers workers running sshd."""
    if not isinstance(settings, MPIJobSettings):
        raise SettingsError("settings must be an MPIJobSettings (use MPIJobSettings.from_dict for JSON)")
    _check_engine(spec)
    _check_name(spec)
    P.check_env(spec)
    P.check_pinned(spec)
    labels = L.job_labels(spec.labels)
    recovery = elastic(spec)  # mpirun, or Horovod's elastic driver when the job has `elastic`
    command = (mpirun_command(spec, settings) if recovery is None
               else horovodrun_elastic_command(spec, settings, recovery))
    launcher = _container("launcher", command, settings, settings.launcher)
    launcher["env"] = _launcher_env(spec, settings)
    launcher_pod = _pod_spec(spec, settings, launcher)
    if recovery is not None:
        # horovodrun hands its whole environment to every rank on one command line: not the variables
        # Kubernetes adds for each Service of the namespace (they can exceed a single argument's length).
        launcher_pod["enableServiceLinks"] = False
    sshd = ["/usr/sbin/sshd", "-De"]
    if not settings.run_as_root:
        sshd += ["-f", "/home/mpiuser/.sshd_config"]
    worker = _container("worker", sshd, settings, settings.worker)
    worker["ports"] = [{"name": "ssh", "containerPort": settings.ssh_port, "protocol": "TCP"}]
    # Ready means sshd answers, so WaitForWorkersReady really waits until mpirun can connect.
    worker["readinessProbe"] = {"tcpSocket": {"port": settings.ssh_port}, "periodSeconds": 2, "failureThreshold": 3}
    worker_pod = _pod_spec(spec, settings, worker)
    # Workers host the ranks (the launcher runs mpirun only): they keep off a straggler's node after a remedy.
    worker_pod["affinity"] = P.with_avoided_nodes(_worker_affinity(spec, settings), spec.avoid_nodes)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": P.metadata(spec.name, spec, settings),
        "spec": {
            "slotsPerWorker": 1,  # one rank per worker pod (JobSpec.num_workers is the world size)
            "runPolicy": settings.run_policy.to_k8s(),
            "sshAuthMountPath": settings.ssh_path,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    # OnFailure: the launcher Job retries mpirun in place, up to runPolicy.backoffLimit.
                    "restartPolicy": "OnFailure",
                    "template": _template(labels, launcher_pod),
                },
                "Worker": {
                    # With elastic too: the launch's count. A pod more (the replicas raised, up to max_workers)
                    # is a slot a new worker joins on once the discovery script lists it; spare pods made here
                    # would hold the launcher back (WaitForWorkersReady) until every one was scheduled.
                    "replicas": spec.num_workers,
                    # The operator never recreates a failed worker pod; restarting it in place lets a
                    # launcher retry find every worker again.
                    "restartPolicy": "OnFailure",
                    "template": _template(labels, worker_pod),
                },
            },
        },
    }
