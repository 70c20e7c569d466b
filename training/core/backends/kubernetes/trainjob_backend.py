"""The "trainjob" backend: one training run is one Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1,
v2.3.0) plus a ConfigMap, on ringflow's ClusterTrainingRuntimes (deploy/trainer/): `ringflow-horovod` for the
Horovod engine, `ringflow-torch` for DDP, `ringflow-tensorflow` for TensorFlow.

Everything but the job kind is ClusterJobBackend's (cluster_job.py), as for MPIJobs: the same labels for
reattach, the same ConfigMap owned by the job, the same foreground delete, the same log cursors.
"""
from __future__ import annotations

import json
from typing import Any

from ..base import JobStatus
from ..job_spec import JobSpec
from . import labels as L
from .cluster_job import ClusterJobBackend, newest_pod
from .client import KubernetesApiError
from .settings import TrainJobSettings
from .trainjob import API_VERSION, KIND, LAUNCHER, NODE, build_trainjob
from ringflow.training.formats.engines import TABLE as ENGINE_TABLE
from ringflow.training.formats.engines import TRAINJOB
from .trainjob_outcome import TRAINJOB_WORDS, outcome_from_trainjob


class TrainJobBackend(ClusterJobBackend):
    kind = TRAINJOB
    settings_class = TrainJobSettings
    resource = "trainjob"
    api_version, object_kind = API_VERSION, KIND
    finished_conditions = TRAINJOB_WORDS.end_conditions
    # The JobSet Trainer makes is named like the TrainJob, and labels every pod with that name.
    pod_job_label = L.JOBSET_NAME_LABEL

    def build(self, spec: JobSpec, settings: Any) -> dict[str, Any]:
        return build_trainjob(spec, settings)

    def outcome(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
        return outcome_from_trainjob(job, pods)

    def log_pod(self, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
        # Horovod: the launcher's (mpirun forwards every rank's output). DDP: node 0's torchrun, whose
        # local rank 0 is the job's rank 0. TensorFlow: node 0, worker 0 of TF_CONFIG, the chief.
        launcher = newest_pod(pods, L.REPLICATED_JOB_LABEL, LAUNCHER)
        if launcher is not None:
            return launcher
        nodes = [p for p in pods if (p["metadata"].get("labels") or {}).get(L.REPLICATED_JOB_LABEL) == NODE]
        return newest_pod(nodes, L.COMPLETION_INDEX_LABEL, "0")

    def explain_create_error(self, error: KubernetesApiError) -> KubernetesApiError:
        # Trainer's webhook refuses a TrainJob whose runtime does not exist: say which one and how to add it.
        if error.status in (400, 403, 422) and "runtime" in str(error).lower():
            runtimes = " / ".join(repr(self.settings.runtime(name)) for name, engine in ENGINE_TABLE.items()
                                  if TRAINJOB in engine.backends)
            body = json.dumps({"message": f"{error}; the ClusterTrainingRuntimes {runtimes} must exist: "
                                          "kubectl apply -k deploy/trainer (after installing Kubeflow Trainer "
                                          "v2.3.0)"})
            return KubernetesApiError(error.op, error.status, error.reason, body)
        return error
