"""Pure functions from a JobSpec and TrainJobSettings to the Kubernetes objects of one training run on
Kubeflow Trainer v2 (`trainer.kubeflow.org/v1alpha1`, release v2.3.0).

Two objects: the same ConfigMap as the MPIJob path (job_parts.build_configmap) and a TrainJob that names
ringflow's ClusterTrainingRuntime for the engine (deploy/trainer/):

- horovod -> `ringflow-horovod` (MPI policy, OpenMPI, runLauncherAsNode): the launcher pod runs mpirun and
  hosts ranks itself, the `node` pods run the image's sshd; the launcher starts once the nodes are Ready.
- ddp -> `ringflow-torch` (torch policy): every `node` pod runs torchrun; Trainer sets PET_NNODES,
  PET_NODE_RANK, PET_MASTER_ADDR/PORT, which torchrun reads as its defaults.
- tensorflow -> `ringflow-tensorflow` (plain policy: Trainer has no TensorFlow one): every `node` pod runs
  tf_pod.py on the TF venv's interpreter, which derives the pod's TF_CONFIG from its index and the JobSet's
  headless-service names, then becomes the rank.

What a TrainJob can set goes in `spec.trainer` (image, command, env, numNodes, numProcPerNode,
resourcesPerNode); what it cannot (the config volume and its mount, service account, pull secrets,
placement) goes in one `runtimePatches` entry, within what the v2.3.0 CRD allows a patch to touch.
"""
from __future__ import annotations

from typing import Any

from ..job_spec import JobSpec, JobSpecError
from . import job_parts as P
from . import labels as L
from . import tf_pod
from .jobset_names import LAUNCHER, NODE, TRAINER_PORT, pod_hostname
from .settings import SettingsError, TrainJobSettings
from ringflow.training.formats.engines import (DEFAULT_ENGINE, TF_CONFIG_LAUNCHER, TRAINJOB, EngineError,
                                                check_backend, check_elastic_backend)
from ringflow.training.health.trainer_status import TRAINJOB_NAME_ENV, TRAINJOB_NAMESPACE_ENV
from ringflow.training.rank.engines import ENGINE_ENV

__all__ = ["API_VERSION", "KIND", "TRAINER_RELEASE", "build_trainjob", "engine_of", "tf_pod_command", "torchrun_command"]

# The TrainJob CRD (kubeflow/trainer v2.3.0), for the manifests here and the API calls in client.py.
TRAINER_RELEASE = "v2.3.0"
GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainJob"
RUNTIME_KIND = "ClusterTrainingRuntime"
# Where torchrun's rendezvous listens on node 0 (Trainer's ContainerTrainerPort).
TORCH_MASTER_PORT = TRAINER_PORT
# Who owns our runtimePatches entry (the webhook wants a domain-prefixed path).
PATCH_MANAGER = "ringflow/trainjob-backend"
# Environment Trainer sets itself and refuses in a TrainJob (MPIReservedEnvNames, TorchRunReservedEnvNames),
# by what starts the ranks in the pods (the engine table's pod_launcher).
RESERVED_ENV = {
    "mpirun": ("OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_keep_fqdn_hostnames",
                "OMPI_MCA_orte_set_default_slots"),
    "torchrun": ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"),
    # What a TensorFlow pod derives TF_CONFIG from, and TF_CONFIG itself (tf_pod.py).
    TF_CONFIG_LAUNCHER: tf_pod.MANAGED_ENV,
}


# What ringflow's runtimes give every pod that hosts rank 0 through the downward API (deploy/trainer/): its TrainJob,
# whose status.trainerStatus rank 0 updates (health/trainer_status.py). A TrainJob's own env must not set them.
RUNTIME_ENV = (TRAINJOB_NAME_ENV, TRAINJOB_NAMESPACE_ENV)


def engine_of(spec: JobSpec) -> str:
    """The spec's engine, if a TrainJob can run it (the engine table)."""
    engine = spec.config.get("engine", DEFAULT_ENGINE)
    try:
        check_backend(engine, TRAINJOB)
        check_elastic_backend(spec.config.get("elastic") is not None, TRAINJOB)
    except EngineError as e:
        raise JobSpecError(f"config field {e}") from None
    return engine


def _pod_launcher(engine: str) -> str:
    return check_backend(engine, TRAINJOB).pod_launcher


def replicated_jobs(engine: str) -> tuple[str, ...]:
    """The replicated jobs of the engine's runtime, each a set of pods that host ranks: mpirun runs in a
    launcher pod of its own (which hosts ranks too), torchrun on every node."""
    return (LAUNCHER, NODE) if _pod_launcher(engine) == "mpirun" else (NODE,)


def _check_name(spec: JobSpec, engine: str) -> None:
    # JobSet pods are "<jobset>-<replicated job>-<job index>-<pod index>", and their hostnames must be
    # DNS-1035 labels; the TrainJob name is also the JobSet's and its headless Service's.
    if _pod_launcher(engine) == "mpirun":
        nodes = max(spec.num_workers - 1, 1)  # runLauncherAsNode: the launcher is one of the nodes
        names = [pod_hostname(spec.name, LAUNCHER, 0), pod_hostname(spec.name, NODE, nodes - 1)]
    else:
        names = [pod_hostname(spec.name, NODE, spec.num_workers - 1)]
    P.check_hostname(spec, max(names, key=len), "TrainJob")


def torchrun_command(python: str) -> list[str]:
    """torchrun on one node. Its node count, rank, processes per node and master come from the PET_* variables
    Trainer sets (torchrun's defaults); no restarts in place: a failed run is retried whole, from its
    checkpoint."""
    return [python, "-m", "torch.distributed.run", "--max-restarts", "0", "-m", "ringflow.training", P.config_path()]


def tf_pod_command(python: str) -> list[str]:
    """On every node, the TF venv's interpreter derives the pod's TF_CONFIG and becomes the rank (tf_pod.py)."""
    return [python, "-m", tf_pod.__name__, P.config_path()]


def _command(spec: JobSpec, settings: TrainJobSettings, engine: str) -> list[str]:
    if _pod_launcher(engine) == "torchrun":
        return torchrun_command(settings.python)
    if _pod_launcher(engine) == TF_CONFIG_LAUNCHER:
        return tf_pod_command(settings.tensorflow_python)
    # Ranks on the other nodes start through ssh with a bare environment: mpirun forwards what they need.
    names = list(P.FORWARDED_ENV) + P.store_env_names(settings) + sorted(spec.env) + [ENGINE_ENV]
    return P.mpirun_command(spec.num_workers, names, settings.python)


def _tf_pod_env(spec: JobSpec, engine: str) -> dict[str, str]:
    """What a TensorFlow pod derives its TF_CONFIG from beside the downward API (tf_pod.py); nothing for the
    other engines. Its node count: the number numNodes gets, which no downward API field exposes."""
    if _pod_launcher(engine) == TF_CONFIG_LAUNCHER:
        return {tf_pod.NUM_WORKERS_ENV: str(spec.num_workers)}
    return {}


def _pod_patch(spec: JobSpec, settings: TrainJobSettings) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "containers": [{"name": NODE, "volumeMounts": [P.config_mount()]}],
        "volumes": [P.config_volume(spec.name)],
        **P.pod_settings(settings),
        # Launcher and nodes all host ranks: pack or spread all of them.
        "affinity": P.with_avoided_nodes(P.placement_affinity(settings.placement, {L.JOBSET_NAME_LABEL: spec.name}),
                                         spec.avoid_nodes),
    }
    return {"metadata": {"labels": L.job_labels(spec.labels)}, "spec": pod}


def build_trainjob(spec: JobSpec, settings: TrainJobSettings) -> dict[str, Any]:
    """The TrainJob for this spec: spec.num_workers nodes of one rank each."""
    if not isinstance(settings, TrainJobSettings):
        raise SettingsError("settings must be a TrainJobSettings (use TrainJobSettings.from_dict for JSON)")
    engine = engine_of(spec)
    _check_name(spec, engine)
    P.check_env(spec, RESERVED_ENV[_pod_launcher(engine)] + (ENGINE_ENV,) + RUNTIME_ENV)
    P.check_pinned(spec)
    command = _command(spec, settings, engine)
    trainer = {
        "image": settings.image,
        "command": command[:1],
        "args": command[1:],
        # Every rank starts the engine its launcher was chosen for, whatever the config says.
        "env": P.store_env(settings) + P.plain_env(spec.env | {ENGINE_ENV: engine} | _tf_pod_env(spec, engine))
        + P.node_name_env(),
        "numNodes": spec.num_workers,
        "numProcPerNode": 1,  # one rank per node (JobSpec.num_workers is the world size)
        "resourcesPerNode": settings.worker.to_k8s(),
    }
    meta = P.metadata(spec.name, spec, settings)
    meta["annotations"][L.ENGINE_ANNOTATION] = engine
    job_spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": GROUP, "kind": RUNTIME_KIND, "name": settings.runtime(engine)},
        "trainer": trainer,
        "runtimePatches": [{
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                {"name": job, "template": {"spec": {"template": _pod_patch(spec, settings)}}}
                for job in replicated_jobs(engine)
            ]}}},
        }],
    }
    if settings.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": job_spec}
