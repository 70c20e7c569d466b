"""What every ringflow training run on Kubernetes carries, whatever the job kind (MPIJob or TrainJob): the job
config as a ConfigMap mounted at /etc/ringflow, the store's endpoint and credentials (from a Secret, never
in the manifest), the caller's environment, the labels that find() reattaches by, and the pod settings.

A user's own training script (the config's entry) needs nothing more: its bundle travels in the run folder in
the store, pinned by the launch (formats/code_bundle.py), and the pods run `python -m ringflow.training CONFIG`
as for ringflow's loop, each rank fetching and checking the bundle; no volume. What the script imports beyond
its folder (its requirements) is the image's business. A config whose entry still names a folder on the
launching machine is refused (check_pinned).

Pure functions over a JobSpec and the kind's settings (MPIJobSettings or TrainJobSettings: both have the
fields read here).
"""
from __future__ import annotations

import json
import re
from typing import Any

from ..job_spec import JobSpec, JobSpecError
from . import labels as L
from ringflow.training.store.s3 import ACCESS_KEY_VAR, ENDPOINT_VAR, SECRET_KEY_VAR
from ....rank.worker_env import NODE_NAME_ENV

CONFIG_MOUNT_PATH = "/etc/ringflow"
CONFIG_FILE = "job.json"
CONFIG_VOLUME = "ringflow-job"
# The variables the ranks' S3 store reads (training/store/s3.py): the two from the Secret, the endpoint as is.
S3_SECRET_KEYS = (ACCESS_KEY_VAR, SECRET_KEY_VAR)
S3_ENDPOINT_ENV = ENDPOINT_VAR
# Always forwarded to every rank by mpirun: ranks start through ssh with a bare environment otherwise.
FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
# The node label every node carries: what placement spreads over and a remedy's anti-affinity names.
HOSTNAME_KEY = "kubernetes.io/hostname"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def configmap_name(job_name: str) -> str:
    # Not "<name>-config" (the MPI Operator's hostfile) nor "<name>-mpi-hostfile" (Kubeflow Trainer's).
    return f"{job_name}-ringflow"


def config_path() -> str:
    return f"{CONFIG_MOUNT_PATH}/{CONFIG_FILE}"


def check_env(spec: JobSpec, reserved: tuple[str, ...] = ()) -> None:
    """The caller's env must not set credentials or what the backend manages (`reserved` adds the kind's own)."""
    managed = set(FORWARDED_ENV) | set(S3_SECRET_KEYS) | {S3_ENDPOINT_ENV} | set(reserved)
    for name in spec.env:
        if not _ENV_NAME.match(name):
            raise JobSpecError(f"env name {name!r} is not a valid variable name; use letters, digits and '_'")
        if name in S3_SECRET_KEYS:
            raise JobSpecError(
                f"env sets {name}; credentials never go into the job spec: set the backend's s3_secret_name instead"
            )
        if name in managed:
            raise JobSpecError(f"env sets {name}, which the backend manages; remove it from the job spec")


def check_pinned(spec: JobSpec) -> None:
    """A user script's code reaches a cluster only as the bundle its launch pinned into the run folder (the pods
    read it from the store, checked against the sha256 in the config: no volume): a config that still names a
    folder on the launching machine would run nothing there, so it is refused before anything is created."""
    entry = spec.config.get("entry")
    if isinstance(entry, dict) and entry.get("folder") is not None:
        raise JobSpecError(f"entry.folder {entry['folder']!r} is a folder on this machine, never packed: launch the "
                           "job with the train operator or ringflow train, which pin its bundle into the run folder "
                           "(code_bundle.pin_entry) and hand the cluster its sha256")


def check_hostname(spec: JobSpec, longest: str, kind: str) -> None:
    """Pod hostnames become DNS names (the headless service): a DNS-1035 label, else the job never starts."""
    if len(longest) > 63 or not _DNS_1035_LABEL.match(longest):
        raise JobSpecError(
            f"job name {spec.name!r} cannot be a {kind} name with {spec.num_workers} workers: the pod hostname "
            f"{longest!r} must start with a letter and have at most 63 characters; use a shorter name"
        )


def store_env(settings: Any) -> list[dict[str, Any]]:
    """The store's credentials (secretKeyRef: the values never appear in a manifest) and its endpoint."""
    env: list[dict[str, Any]] = []
    if settings.s3_secret_name:
        for key in S3_SECRET_KEYS:
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": settings.s3_secret_name, "key": key}}})
    if settings.s3_endpoint:
        env.append({"name": S3_ENDPOINT_ENV, "value": settings.s3_endpoint})
    return env


def store_env_names(settings: Any) -> list[str]:
    return [e["name"] for e in store_env(settings)]


def plain_env(env: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in sorted(env.items())]


def mpirun_command(np: int, env_names: list[str], python: str, allow_run_as_root: bool = False) -> list[str]:
    """mpirun over the hosts of the hostfile the operator mounts (OMPI_MCA_orte_default_hostfile)."""
    cmd = ["mpirun", "-np", str(np)]
    if allow_run_as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["-bind-to", "none", "-map-by", "slot"]
    for name in env_names:
        cmd += ["-x", name]
    # ob1 over TCP: no InfiniBand assumed; excluding openib silences its probe warnings on plain nodes.
    cmd += ["-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    return cmd + [python, "-m", "ringflow.training", config_path()]


def config_mount() -> dict[str, Any]:
    return {"name": CONFIG_VOLUME, "mountPath": CONFIG_MOUNT_PATH, "readOnly": True}


def config_volume(job_name: str) -> dict[str, Any]:
    return {"name": CONFIG_VOLUME, "configMap": {"name": configmap_name(job_name)}}


def pod_settings(settings: Any) -> dict[str, Any]:
    """The pod-level settings both kinds apply the same way: service account, pull secrets, placement."""
    pod: dict[str, Any] = {}
    if settings.service_account:
        pod["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if settings.node_selector:
        pod["nodeSelector"] = dict(sorted(settings.node_selector.items()))
    if settings.tolerations:
        pod["tolerations"] = [dict(t) for t in settings.tolerations]
    return pod


def placement_affinity(placement: str, match_labels: dict[str, str]) -> dict[str, Any]:
    """Pack the ranks' pods on few nodes, or spread them one per node.

    Preferred, not required: a required rule makes the job unschedulable when there are fewer (or more)
    nodes than the rule assumes; preferred still packs or spreads whenever the cluster allows.
    """
    term = {
        "weight": 100,
        "podAffinityTerm": {"labelSelector": {"matchLabels": dict(match_labels)},
                            "topologyKey": HOSTNAME_KEY},
    }
    kind = "podAffinity" if placement == "pack" else "podAntiAffinity"
    return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}


def with_avoided_nodes(affinity: dict[str, Any], avoid_nodes: tuple[str, ...]) -> dict[str, Any]:
    """`affinity` with the pods kept off `avoid_nodes` (JobSpec.avoid_nodes: a straggler's node, after a
    remedy). Required, unlike the placement: a pod on that node would make the next try as slow as the last;
    a job that cannot be scheduled elsewhere waits, and the task's timeout says so."""
    if not avoid_nodes:
        return affinity
    term = {"matchExpressions": [{"key": HOSTNAME_KEY, "operator": "NotIn", "values": list(avoid_nodes)}]}
    return affinity | {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def node_name_env() -> list[dict[str, Any]]:
    """The pod's node, from the downward API, as the rank reads it (worker_env.NODE_NAME_ENV): rank 0 writes
    every rank's node in the health records, and a straggler's node is what a remedy keeps the job off."""
    return [{"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]


def metadata(name: str, spec: JobSpec, settings: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": L.job_labels(spec.labels),
        "annotations": {L.ORIGINAL_LABELS_ANNOTATION: L.original_labels_annotation(spec.labels)},
    }
    if settings.namespace:
        meta["namespace"] = settings.namespace
    return meta


def build_configmap(spec: JobSpec, settings: Any) -> dict[str, Any]:
    """The ConfigMap holding JobSpec.config as /etc/ringflow/job.json."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(configmap_name(spec.name), spec, settings),
        "data": {CONFIG_FILE: json.dumps(spec.config, sort_keys=True, indent=2) + "\n"},
    }
