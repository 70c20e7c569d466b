"""The Kubernetes backends: one training run is one job object plus a ConfigMap with its config.

"mpijob": an MPIJob (kubeflow/mpi-operator v2beta1), here; "trainjob": a Kubeflow Trainer v2 TrainJob
(trainjob_backend.py), on the same ClusterJobBackend (cluster_job.py); and the choice between them a
deployment makes (`backend_from_env`).

Job id = the job object's name (JobSpec.name), in the namespace of the settings (or the connection's).
The constructor takes plain JSON, so `backend_from_dict("mpijob", backend.to_dict(), connections)` rebuilds
it in the triggerer; `conn_id` names the cluster connection that `connections` resolves (backends/connections.py).
"""
from __future__ import annotations

from typing import Any

from ..base import JobStatus
from ..connections import Connections
from ..job_spec import JobSpec
from . import labels as L
from .cluster_job import ClusterJobBackend, newest_pod
from .mpijob import API_VERSION, KIND, MPIJobSettings, build_mpijob
from .mpijob_outcome import MPIJOB_WORDS, outcome_from_status
from .trainjob_backend import TrainJobBackend
from ringflow.training.formats.engines import MPIJOB


class MPIJobBackend(ClusterJobBackend):
    """Horovod ranks in a Kubeflow MPIJob (kubeflow.org/v2beta1, MPI Operator v0.8.2)."""

    kind = MPIJOB
    settings_class = MPIJobSettings
    resource = "mpijob"
    api_version, object_kind = API_VERSION, KIND
    finished_conditions = MPIJOB_WORDS.end_conditions
    pod_job_label = L.JOB_NAME_LABEL

    def build(self, spec: JobSpec, settings: Any) -> dict[str, Any]:
        return build_mpijob(spec, settings)

    def outcome(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
        return outcome_from_status(job, pods)

    def log_pod(self, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
        # The launcher's: it prints every rank's output (mpirun forwards it).
        return newest_pod(pods, L.JOB_ROLE_LABEL, "launcher")


SETTINGS_ENV = "RINGFLOW_MPIJOB_SETTINGS"
TRAINJOB_SETTINGS_ENV = "RINGFLOW_TRAINJOB_SETTINGS"
CONN_ENV = "RINGFLOW_K8S_CONN_ID"
# The cluster connection (type kubernetes) a Kubernetes backend reaches the API server with.
DEFAULT_K8S_CONN_ID = "ringflow_k8s"


def backend_from_env(environ: dict[str, str] | None = None,
                     connections: Connections | None = None) -> ClusterJobBackend | None:
    """The Kubernetes backend a deployment configured, or None (then DAGs use local workers).

    $RINGFLOW_MPIJOB_SETTINGS holds MPIJobSettings as JSON (deploy/airflow-values.yaml sets it): MPIJobs.
    $RINGFLOW_TRAINJOB_SETTINGS holds TrainJobSettings as JSON: Kubeflow Trainer v2 TrainJobs. At most one.
    $RINGFLOW_K8S_CONN_ID names the cluster connection `connections` resolves (default "ringflow_k8s").
    """
    import json
    import os

    env = os.environ if environ is None else environ
    chosen = [name for name in (SETTINGS_ENV, TRAINJOB_SETTINGS_ENV) if (env.get(name) or "").strip()]
    if not chosen:
        return None
    if len(chosen) > 1:
        raise ValueError(f"both ${SETTINGS_ENV} and ${TRAINJOB_SETTINGS_ENV} are set; set only the one for the "
                         "job kind this cluster runs (MPIJobs or Kubeflow Trainer TrainJobs)")
    (name,) = chosen
    what = "MPIJob" if name == SETTINGS_ENV else "TrainJob"
    try:
        settings = json.loads(env[name])
    except ValueError as e:
        raise ValueError(f"${name} is not valid JSON ({e}); set it to the {what} settings object") from e
    if name == SETTINGS_ENV:
        cls: type[ClusterJobBackend] = MPIJobBackend
    else:
        cls = TrainJobBackend
    return cls(settings, conn_id=env.get(CONN_ENV) or DEFAULT_K8S_CONN_ID, connections=connections)
