"""The engine table: for each data-parallel engine, what starts its ranks and where it can run.

Every layer reads the engine's facts here: the config (which names are engines, and each one's section),
the local launcher (`launcher.launch_command`: horovodrun or torchrun), the Kubernetes backends (which job
kinds can run it, which TrainJob runtime, mpirun or torchrun in the pods) and the rank (`engines/`: which
module starts it). The engine is checked against the backend once, when the task starts (`check_backend`):
before anything is launched, and without retry, because a retry would meet the same mismatch.

Adding an engine = one entry here + one rank module (training/rank/engines/<name>.py). No torch, no Airflow.
"""
from __future__ import annotations

import dataclasses

# The backend kinds (backends/base.py's _BACKEND_CLASSES: each kind's class), named for what each creates.
LOCAL, MPIJOB, TRAINJOB = "local", "mpijob", "trainjob"
# The engines' names (the config's `engine`), each spelled here only.
HOROVOD, DDP, TENSORFLOW = "horovod", "ddp", "tensorflow"
# The launcher of engines whose ranks ringflow starts itself, one process each with its TF_CONFIG.
TF_CONFIG_LAUNCHER = "tf_config"
# How a backend that refuses an engine is replaced, in words a person can act on.
_BACKEND_HOW = {
    LOCAL: "locally (backend=LocalProcessBackend())",
    MPIJOB: "as a Kubeflow MPIJob (set $RINGFLOW_MPIJOB_SETTINGS, or pass backend=MPIJobBackend(...))",
    TRAINJOB: "as a Kubeflow TrainJob (set $RINGFLOW_TRAINJOB_SETTINGS instead of $RINGFLOW_MPIJOB_SETTINGS, "
              "or pass backend=TrainJobBackend(...))",
}
# What each cluster backend creates, for the messages.
_BACKEND_CREATES = {LOCAL: "local processes", MPIJOB: "an MPIJob", TRAINJOB: "a TrainJob"}


class EngineError(ValueError):
    """The engine is not one ringflow has, or the backend cannot run it; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """One data-parallel engine.

    name: the config's `engine`. config_section: its knobs in the job config (JobConfig.<section>).
    launcher: what starts a local job's ranks ("horovodrun", "torchrun", or "tf_config": ringflow itself, one
    process per worker with its TF_CONFIG); controllers: the launcher's
    controllers to choose from, first the default (none for torchrun). pod_launcher: what starts the ranks in
    a cluster job's pods ("mpirun" over the workers' sshd, "torchrun" on every node, or "tf_config": on every
    node a ringflow entry that writes the worker's TF_CONFIG and starts its rank). backends: the backend
    kinds that can run it. trainjob_runtime: the default ClusterTrainingRuntime (deploy/trainer/) of a
    TrainJob, and the TrainJobSettings field that overrides it. rank_engine: "module:class" that starts it
    in a rank (training/rank/engines/).
    """

    name: str
    config_section: str
    launcher: str
    controllers: tuple[str, ...]
    pod_launcher: str
    backends: tuple[str, ...]
    trainjob_runtime: str
    trainjob_runtime_setting: str
    rank_engine: str

    @property
    def default_controller(self) -> str | None:
        return self.controllers[0] if self.controllers else None

    @property
    def starts_workers_itself(self) -> bool:
        """No launcher program: ringflow starts each worker with its TF_CONFIG, in the TF venv's interpreter
        (torch-free ranks: rank/tensorflow_worker.py)."""
        return self.launcher == TF_CONFIG_LAUNCHER


TABLE: dict[str, EngineSpec] = {e.name: e for e in (
    # Horovod's controller: "mpi" was chosen by bench/throughput.py (bench/results/throughput.md).
    EngineSpec(HOROVOD, config_section="horovod", launcher="horovodrun", controllers=("mpi", "gloo"),
           pod_launcher="mpirun", backends=(LOCAL, MPIJOB, TRAINJOB), trainjob_runtime="ringflow-horovod",
           trainjob_runtime_setting="horovod_runtime", rank_engine="ringflow.training.rank.engines.horovod:HorovodEngine"),
    EngineSpec(DDP, config_section="ddp", launcher="torchrun", controllers=(),
           pod_launcher="torchrun", backends=(LOCAL, TRAINJOB), trainjob_runtime="ringflow-torch",
           trainjob_runtime_setting="ddp_runtime", rank_engine="ringflow.training.rank.engines.ddp:DdpEngine"),
    # TensorFlow's MultiWorkerMirroredStrategy: no launcher program; ringflow starts one process per worker
    # with its TF_CONFIG (tf_config.py) and the TF venv's interpreter. Its rank is torch-free and has a loop
    # of its own: `python -m ringflow.training` hands a "tf_config" engine's rank to
    # rank/tensorflow_worker.py, which starts this rank_engine.
    EngineSpec(TENSORFLOW, config_section="tensorflow", launcher=TF_CONFIG_LAUNCHER, controllers=(),
           pod_launcher=TF_CONFIG_LAUNCHER, backends=(LOCAL, TRAINJOB), trainjob_runtime="ringflow-tensorflow",
           trainjob_runtime_setting="tensorflow_runtime", rank_engine="ringflow.training.rank.engines.tensorflow:TensorflowEngine"),
)}
ENGINES = tuple(TABLE)
DEFAULT_ENGINE = HOROVOD
# horovodrun's controllers (the local launcher's --gloo/--mpi), and the default.
CONTROLLERS = tuple(sorted(TABLE[DEFAULT_ENGINE].controllers))
DEFAULT_CONTROLLER = TABLE[DEFAULT_ENGINE].default_controller


def engine_spec(name: str) -> EngineSpec:
    """The table's entry for `name`; EngineError naming the engines there are."""
    try:
        return TABLE[name]
    except (KeyError, TypeError):
        raise EngineError(f"'engine' is {name!r}; use one of {ENGINES}") from None


def check_backend(name: str, backend_kind: str) -> EngineSpec:
    """The engine, if a `backend_kind` backend can run it; else EngineError saying where it can run."""
    found = engine_spec(name)
    if backend_kind not in found.backends:
        # The cluster backends first: a job refused by one is most likely meant for a cluster.
        where = ", or ".join(_BACKEND_HOW[b] for b in sorted(found.backends, key=lambda b: b == LOCAL))
        can = sorted(n for n, e in TABLE.items() if backend_kind in e.backends)
        instead = " or ".join(f'"{n}"' for n in can)
        raise EngineError(
            f"engine {name!r} cannot run as {_BACKEND_CREATES.get(backend_kind, f'a {backend_kind!r} job')} "
            f"(it launches {', '.join(repr(n) for n in can) or 'no'} engine ranks with "
            f"{'/'.join(sorted({TABLE[n].pod_launcher for n in can})) or 'nothing'}). Run the {name} engine "
            f"{where}, or set engine to {instead}")
    return found


# Where recovery inside the job (the config's `elastic`) runs: local processes, whose launcher ringflow makes
# elastic: horovodrun's elastic driver (Horovod: rank/elastic.py, core/elastic_hosts.py) or torchrun with restarts
# and a copy of the state on the host's memory disk (DDP: rank/ddp_elastic.py); and an MPIJob, whose launcher
# then runs horovodrun's elastic driver over the worker pods the MPI Operator's discovery script lists
# (kubernetes/mpijob.py). A TrainJob's runtime runs torchrun or mpirun as the cluster's ClusterTrainingRuntime
# says, not made elastic by ringflow: there a death ends the job and the task's retry resumes from the last
# checkpoint.
ELASTIC_BACKENDS = (LOCAL, MPIJOB)


def check_elastic_backend(elastic: bool, backend_kind: str) -> None:
    """EngineError if a job with `elastic` set is to run where recovery inside the job cannot."""
    if elastic and backend_kind not in ELASTIC_BACKENDS:
        raise EngineError(f"elastic is set, but {_BACKEND_CREATES.get(backend_kind, backend_kind)} cannot recover "
                          f"inside the job (its launcher is not made elastic: no Horovod elastic driver, no torchrun "
                          f"restarts): remove elastic (a death then ends the job and the retry resumes from the last "
                          f"checkpoint), or run {_BACKEND_HOW[LOCAL]} or {_BACKEND_HOW[MPIJOB]}")
