"""The deferrable training operator (Horovod, DDP or TensorFlow): build the job spec, check the engine against the
backend, launch it through a Backend, defer to the trigger, and turn the trigger's one event into success or
a failure a person can act on, through the failure policy (training/core/failure_policy.py) and what comes
after the try (training/core/attempts.py: the retry, as it was or changed by a remedy, or none)."""
from __future__ import annotations

import ast
import datetime as dt
import hashlib
import json
import os
import re
import time
from typing import Any, Mapping, Sequence

from airflow.sdk import BaseOperator
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, AirflowConnections
from ringflow.operators.tracking import MlflowTracking
from ringflow.operators.links import HealthPlotLink, RunFolderLink, RunLinks, RunPageLink, api_base_path, run_links
from ringflow.training.core.backends.base import Backend, backend_from_dict
from ringflow.training.core.backends.job_spec import JobSpec
from ringflow.training.formats.engines import DEFAULT_CONTROLLER
from ringflow.training.core.attempts import Next, NextTry, next_try
from ringflow.training.core.backends.base import JobState
from ringflow.training.core.failure_policy import Decision, Observation, decide
from ringflow.training.core.remediation import rank_nodes
from ringflow.training.core.try_plan import TryPlan, faults_on_try, plan_try, planned_remedies, recorded
from ringflow.training.formats.engines import LOCAL, check_backend, check_elastic_backend
from ringflow.training.formats.run_result import RunResult
from ringflow.training.core.runs import store_layout
from ringflow.training.core.worker_count import NotEnoughCapacity, workers_to_launch
from ringflow.training.rank.worker_env import ATTEMPT_ENV


def train_run_uri(store_uri: str, ti: Any, group_id: str | None, map_index: int | None) -> str:
    """The run folder of the train task in TaskGroup `group_id` of `ti`'s DAG run, at `map_index` (a mapped
    copy's; None or -1: not mapped): the one place a run folder is derived (store_layout.run_uri), for the
    train task itself and for a sweep's selection reading each candidate's."""
    return store_layout.run_uri(str(store_uri), ti.dag_id, ti.run_id, group_id, map_index=map_index)


def job_name(dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
    """A DNS-1123 name, readable and unique per task try (an MPIJob name and a local job folder alike)."""
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{task_id}".encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", f"{dag_id}-{task_id}".lower()).strip("-")[:36].strip("-")
    return f"rf-{slug}-{digest}-t{try_number}"


# Where a run reads and writes belongs to the operator: manifest_uri is the shard step's, run_uri the task's
# run folder. An override of either could point a run at another team's data or run folder. The remediation's
# fields are the retry's to set (remediation.apply_remedies): a resume_before_step by hand would send every
# retry back before that step.
# The script a run executes (`entry`) is the operator's entry argument: an override could run any code.
OWNED_FIELDS = ("manifest_uri", "run_uri", "resume_before_step", "remedies", "entry")


def owned_fields_in(overrides: dict[str, Any]) -> list[str]:
    """The operator-owned fields (OWNED_FIELDS) that `overrides` would set."""
    return [name for name in OWNED_FIELDS if name in overrides]


def check_overrides(overrides: dict[str, Any]) -> None:
    """Refuse overrides that would change where the run reads or writes, naming the field."""
    from ringflow.training.formats.config import ConfigError

    found = owned_fields_in(overrides) if isinstance(overrides, dict) else []
    if found:
        field = found[0]
        if field in ("manifest_uri", "run_uri"):
            raise ConfigError(field, "cannot be overridden in job_config: the operator sets it (manifest_uri from "
                                     "its manifest_uri argument, the shard step's output; run_uri, this task's "
                                     "run folder)",
                              f"remove '{field}' from job_config, and pass manifest_uri/run_uri to the operator "
                              f"instead")
        if field == "entry":
            raise ConfigError(field, "cannot be set in job_config: the training script is the operator's entry "
                                     "argument (TrainingSpec.entry), picked from its scripts_dir when it has one",
                              "remove 'entry' from job_config and pass entry={\"script\": ..., \"folder\": ...} "
                              "to the operator")
        raise ConfigError(field, "cannot be set in job_config: the operator's retry sets it under remediation "
                                 "\"auto\" (what it changed and from which step it resumes)",
                          f"remove '{field}' from job_config; set remediation: \"auto\" to have retries remediate")


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in (overrides or {}).items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def job_overrides(value: Any) -> dict[str, Any]:
    """`job_config` as the task got it: a dict, nothing, or the text a template rendered to: JSON, or the
    Python literal that `{{ params.job_overrides }}` gives for a dict when the DAG does not render native
    objects."""
    from ringflow.training.formats.config import ConfigError

    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        return {}
    value = rendered_literal("job_config", value, "dict", "{{ params.job_overrides | tojson }}")
    if not isinstance(value, Mapping):
        raise ConfigError("job_config", f"is {type(value).__name__} {value!r}, not an object",
                          "give a dict of config fields, e.g. {\"checkpoint\": {\"every_steps\": 20}}")
    return dict(value)


def rendered_literal(name: str, value: Any, kind: str, example: str) -> Any:
    """A dict or list argument as the task got it: itself, or the text a template rendered it to (JSON, or the
    Python literal `{{ params.x }}` gives when the DAG does not render native objects)."""
    from ringflow.training.formats.config import ConfigError

    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        try:
            return ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ConfigError(name, f"rendered to {value[:200]!r}, which is neither JSON nor a Python {kind}",
                              f"give a {kind}, or a template rendering to one (e.g. '{example}')") from None


def rendered_number(name: str, value: Any, kind: type) -> Any:
    """An operator argument that may have come from a template as text ("5", "0.002"), as `kind` (int or
    float); None stays None (the config's default)."""
    from ringflow.training.formats.config import ConfigError

    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        return None
    if isinstance(value, bool):
        raise ConfigError(name, f"is {value!r}", f"give a {'whole number' if kind is int else 'number'}")
    try:
        number = kind(value.strip()) if isinstance(value, str) else value
    except ValueError:
        number = None
    if kind is int and isinstance(number, float) and number.is_integer():
        number = int(number)
    if not isinstance(number, (int, float)) or (kind is int and not isinstance(number, int)):
        raise ConfigError(name, f"rendered to {value!r}",
                          f"give a {'whole number' if kind is int else 'number'}, or a template rendering to one")
    return number


def worker_count(value: Any) -> int:
    """num_workers as the task got it (text, from a template such as '{{ params.num_workers }}')."""
    try:
        count = int(str(value).strip()) if not isinstance(value, bool) else 0
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"num_workers is {value!r}; give a whole number >= 1, or a template rendering to one")
    return count


def rendered_text(value: Any) -> str | None:
    """An operator argument that may have come from a template as text; empty or "None" is None (the
    config's default)."""
    if value is None:
        return None
    text = str(value).strip()
    return None if text in ("", "None") else text


def entry_for(entry: Mapping[str, Any] | None, scripts_dir: str | None = None,
              relative_to: str | None = None) -> dict[str, Any] | None:
    """The job config's `entry` from the operator's (as it rendered): with `scripts_dir`, its folder is the name
    of a script folder there (code_bundle.script_folder refuses any other, in one line); else a path, relative
    to `relative_to` (the DAG file's folder) when not absolute. None: ringflow's own loop."""
    from ringflow.training.formats.code_bundle import script_folder
    from ringflow.training.formats.config import ConfigError

    if entry is None or entry == {}:
        return None
    if not isinstance(entry, Mapping):
        raise ConfigError("entry", f"is {entry!r}", 'give {"script": "train.py", "args": [...], "folder": ...}')
    out = dict(entry)
    if out.get("args") is not None:
        out["args"] = rendered_literal("entry.args", out["args"], "list", "{{ params.script_args | tojson }}")
    folder = rendered_text(out.get("folder"))
    if scripts_dir is not None:
        base = os.path.join(relative_to, scripts_dir) if relative_to else scripts_dir
        out["folder"] = script_folder(base, folder or "", str(out.get("script")))
    elif folder is not None:
        out["folder"] = os.path.join(relative_to, folder) if relative_to else folder
    return out


def build_job_config(*, manifest_uri: str, run_uri: str, overrides: Any = None, epochs: Any = None,
                     batch_size: Any = None, learning_rate: Any = None, engine: Any = None,
                     try_number: int = 1, entry: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The checked job config of one try: where it reads and writes (the operator's), epochs, batch size,
    learning rate and engine, then `overrides` on top. Injected faults (tests only) fire on the try they name
    (`on_try`, the first by default): a retry resumes from the last checkpoint and shows the recovery instead
    of failing at the same step again, or meets the next fault of a chain."""
    from ringflow.training.formats.config import JobConfig

    overrides = job_overrides(overrides)
    check_overrides(overrides)  # after rendering too: a template may have produced them
    base: dict[str, Any] = {"manifest_uri": manifest_uri, "run_uri": run_uri}
    if entry is not None:
        base["entry"] = dict(entry)  # checked by JobConfig (EntryConfig); pinned when a try launches
    for name, value, kind in (("epochs", epochs, int), ("batch_size", batch_size, int),
                              ("learning_rate", learning_rate, float)):
        value = rendered_number(name, value, kind)
        if value is not None:
            base[name] = value
    if rendered_text(engine) is not None:
        base["engine"] = rendered_text(engine)  # JobConfig checks it against the engine table
    cfg = JobConfig.from_dict(merge(base, overrides))  # checked here: a bad value fails before any launch
    return faults_on_try(cfg, try_number).to_dict()


class TrainOperator(BaseOperator):
    """Train data-parallel (Horovod, PyTorch DDP or TensorFlow: `engine`) on `num_workers` workers, without
    holding a worker slot.

    :param manifest_uri: the shard step's manifest.json (templated).
    :param run_uri: the run folder: checkpoints, health.jsonl, result.json (templated). Default: derived
        when the task runs, `runs/<dag_id>/<run_id>/<task group>/` under `store_uri` (store_layout.run_uri). The
        same folder for every try of the task, so a retry resumes from the last checkpoint.
    :param store_uri: the store the run folder is derived in, when run_uri is not given (templated).
    :param epochs, batch_size, learning_rate: the config's fields (templated; text from a template is read
        as a number); None leaves the config's default, or what job_config says.
    :param engine: the config's `engine`, "horovod" (horovodrun), "ddp" (PyTorch DDP under torchrun) or
        "tensorflow" (MultiWorkerMirroredStrategy workers ringflow starts with their TF_CONFIG) (templated;
        checked when the task runs); None leaves the config's default, or what job_config says.
    :param min_workers: the fewest workers a try may run on (templated); None: exactly num_workers. Each try
        asks the backend how many workers it can place now (Kubernetes: Ready, schedulable nodes the workers'
        node selector and tolerations allow, one worker each; local: all) and launches min(num_workers, that)
        when it is at least min_workers, else fails with the numbers (the task's retries try again). Training
        resumes sample-exact on the new number, with the accumulation and learning rate rescaled.
    :param job_config: overrides of the training config (model, health, horovod, ...; see
        ringflow.training.formats.config.JobConfig), applied last (templated: a dict, or JSON / a dict literal).
        Injected `faults` (tests only) apply on the try they name (`on_try`, the first by default). With
        `remediation: "auto"` a retry runs with the remedy for the verdict the last try failed on
        (training/core/remediation.py; remedies.jsonl in the run folder).
    :param backend: where the job runs; local `horovodrun`/`torchrun`/TF worker processes by default, or
        ringflow.training.core.backends.kubernetes.mpijob_backend.MPIJobBackend for Kubeflow MPIJobs (Horovod), or
        ringflow.training.core.backends.kubernetes.trainjob_backend.TrainJobBackend for Kubeflow Trainer TrainJobs.
    :param entry: the user's own training script, run on every rank instead of ringflow's loop (templated):
        {"script": "train.py", "args": [...], "folder": ...}. Each try packs the folder into the run folder and
        hands the backend a job config with its sha256 pinned (formats/code_bundle.py), never the folder: every
        rank checks the bundle before it runs anything. None: ringflow's own loop.
    :param scripts_dir: the folder of script folders entry's folder is picked from (a trigger form's choice):
        entry["folder"] is then the name of one of its subfolders, and any other is refused in one line.
        Relative paths (scripts_dir, or entry's folder without it) are relative to the DAG file's folder.
    :param conn_id: Airflow connection (type aws) for s3:// URIs; None: no connection (connections.py).
    :param job_timeout: stop the job and fail the task when it runs longer.
    :param mlflow_conn_id: Airflow connection (type http) of an MLflow server: each attempt, whatever its
        outcome, is logged to the run folder's MLflow run (operators/tracking.py); None: no MLflow.
    :param mlflow_experiment: the MLflow experiment (default: the DAG id).
    """

    template_fields: Sequence[str] = ("manifest_uri", "run_uri", "store_uri", "job_config", "num_workers",
                                      "min_workers", "epochs", "batch_size", "learning_rate", "engine", "entry")
    template_fields_renderers = {"job_config": "json"}
    ui_color = "#f4a261"
    # Shown on the task in the UI; their URLs are computed when the task runs (links.py).
    operator_extra_links = (RunPageLink(), RunFolderLink(), HealthPlotLink())

    def __init__(self, *, manifest_uri: str, run_uri: str | None = None, store_uri: str | None = None,
                 num_workers: int | str = 2, min_workers: int | str | None = None, epochs: int | str | None = None, batch_size: int | str | None = None,
                 learning_rate: float | str | None = None, engine: str | None = None,
                 job_config: dict[str, Any] | str | None = None,
                 backend: Backend | None = None, controller: str = DEFAULT_CONTROLLER,
                 conn_id: str | None = DEFAULT_S3_CONN_ID, poll_interval: float = 2.0,
                 job_timeout: dt.timedelta | None = None, mlflow_conn_id: str | None = None,
                 mlflow_experiment: str | None = None, entry: Mapping[str, Any] | None = None,
                 scripts_dir: str | None = None, **kwargs):
        super().__init__(**kwargs)
        if not run_uri and not store_uri:
            raise ValueError(f"task {self.task_id!r}: give run_uri (the run folder) or store_uri (the run folder "
                             f"is then runs/<dag_id>/<run_id>/<task group>/ under it)")
        self.manifest_uri, self.run_uri, self.store_uri = manifest_uri, run_uri, store_uri
        self.num_workers, self.epochs, self.batch_size, self.learning_rate = num_workers, epochs, batch_size, learning_rate
        self.min_workers = min_workers
        self.engine = engine
        self.entry, self.scripts_dir = entry, scripts_dir
        self.job_config = job_config or {}
        if isinstance(self.job_config, dict):  # a plain dict is checked now, when the DAG is parsed
            check_overrides(self.job_config)
        self.backend = backend
        self.controller, self.conn_id, self.poll_interval = controller, conn_id, poll_interval
        self.job_timeout = job_timeout
        self.mlflow_conn_id, self.mlflow_experiment = mlflow_conn_id, mlflow_experiment
        self._job_id: str | None = None
        self.run_links: RunLinks | None = None  # what the extra links open, set when the task runs

    def _get_backend(self) -> Backend:
        """The backend, with Airflow's connections to resolve its conn_id (a DAG builds it without)."""
        if self.backend is None:
            from ringflow.training.core.backends.local import LocalProcessBackend

            self.backend = LocalProcessBackend(conn_id=self.conn_id, connections=AirflowConnections())
        elif self.backend.connections is None:
            self.backend = backend_from_dict(self.backend.kind, self.backend.to_dict(), AirflowConnections())
        return self.backend

    def run_folder(self, context) -> str:
        """run_uri, or the one store_layout.run_uri derives from the store, the DAG run and this task's group."""
        if self.run_uri:
            return str(self.run_uri)
        ti = context["ti"]
        return train_run_uri(self.store_uri, ti, getattr(self.task_group, "group_id", None),
                             getattr(ti, "map_index", None))

    def build_config(self, run_uri: str, try_number: int = 1) -> dict[str, Any]:
        return build_job_config(manifest_uri=self.manifest_uri, run_uri=run_uri, overrides=self.job_config,
                                epochs=self.epochs, batch_size=self.batch_size, learning_rate=self.learning_rate,
                                engine=self.engine, try_number=try_number,
                                entry=entry_for(self.entry, self.scripts_dir, self._dag_folder()))

    def _dag_folder(self) -> str | None:
        fileloc = getattr(self.dag, "fileloc", None) if self.has_dag() else None
        return os.path.dirname(fileloc) if fileloc else None

    def pinned(self, config: Any) -> Any:
        """`config` (a JobConfig) with its entry's folder packed into the run folder and its sha256 pinned
        (formats/code_bundle.py): what the backend gets, on every backend, so no rank runs unpinned code."""
        from ringflow.operators.connections import open_store_for
        from ringflow.training.formats.code_bundle import bundle_key, pin_entry

        if config.entry is None or config.entry.folder is None:
            return config
        pinned = pin_entry(config, open_store_for(self.run_uri, self.conn_id))
        self.log.info("code bundle of %s pinned: %s/%s", config.entry.folder, self.run_uri.rstrip("/"),
                      bundle_key(pinned.entry.bundle_sha256))
        return pinned

    def execute(self, context) -> None:
        self._start(context, waited=False)

    def launch_after_wait(self, context, event: Any = None) -> None:
        """Back from the wait a remedy asked for (a store outage: remediation.WAIT_FOR_STORE): launch now."""
        self._start(context, waited=True)

    def _start(self, context, *, waited: bool) -> None:
        ti = context["ti"]
        self.run_uri = self.run_folder(context)
        self._set_run_links(None, plot_saved=False)
        try:
            plan = self.plan(ti.try_number)
            if not waited:
                self._announce(plan, ti.try_number)  # defers first when the plan waits: the store may be down
            config = self.pinned(plan.config).to_dict()
            num_workers = worker_count(self.num_workers)
            backend = self._get_backend()
            # The engine is checked once, here, before anything is launched (formats/engines.py).
            check_backend(config["engine"], backend.kind)
            check_elastic_backend(config.get("elastic") is not None, backend.kind)
            num_workers = self._workers_now(num_workers, backend, plan.avoid_nodes)
            self._preflight(config, num_workers, backend)
        except NotEnoughCapacity as exc:  # the cluster may have the nodes again by the next try
            raise AirflowException(str(exc)) from exc
        except ValueError as exc:  # ConfigError, ManifestError, SettingsError, EngineError, a bad worker count
            # Nothing was launched: the policy fails it without retry (a retry would meet the same config).
            raise AirflowFailException(decide(Observation(JobState.PENDING, refused=str(exc))).reason) from exc
        self._launch(ti, config, num_workers, backend, plan.avoid_nodes, changed=plan.own is not None)

    def _announce(self, plan, try_number: int) -> None:
        """Say what a remedy changes in this try; defer first when it waits (a store outage), before anything
        reads or writes the store (the code bundle, the manifest): those would fail again while it is down."""
        if plan.own is not None:
            self.log.info("remediation: try %d runs changed after %s: %s", plan.try_number,
                          plan.own.remedy.verdict, plan.own.remedy.words)
        if plan.wait_seconds > 0:
            # Deferred: the wait holds no worker slot (a store outage can last minutes).
            self.log.info("remediation: waiting %gs before launching try %d", plan.wait_seconds, try_number)
            self.defer(trigger=TimeDeltaTrigger(dt.timedelta(seconds=plan.wait_seconds)),
                       method_name="launch_after_wait")

    def _launch(self, ti: Any, config: dict[str, Any], num_workers: int, backend: Backend,
                avoid_nodes: tuple[str, ...], *, changed: bool = False) -> None:
        """Launch this try's job, or reattach to a live one of an earlier try. `changed`: a remedy changes this
        try, so an earlier try's job (left running when stopping it failed) runs the old config: it is
        stopped, never reattached to, or the try would report a change that never ran."""
        # a mapped copy (a sweep candidate) is its own job: never reattach to, or reuse the name of, a sibling's
        task = ti.task_id if getattr(ti, "map_index", None) in (None, -1) else f"{ti.task_id}.m{ti.map_index}"
        labels = {"dag": ti.dag_id, "run": ti.run_id, "task": task}
        # A retry reconnects by the labels the job was created with, not by a job id kept in Airflow 3.3's
        # task_state_store: that id is written only after launch() returns, so a worker lost in between leaves
        # a live job no stored id names (the gap ResumableJobMixin documents), while the labels are on the job
        # from its creation; and the store is keyed by (dag, run, task, map index), which the labels already
        # hold, so it would add a second route to the same fact. It exists only under the Task SDK supervisor.
        job_id = backend.find(labels)
        if job_id and changed:
            self.log.info("stopping live job %s of an earlier try: this try runs changed (remediation)", job_id)
            backend.delete(job_id)
            job_id = None
        if job_id:
            self.log.info("reattaching to live job %s from an earlier try (labels %s)", job_id, labels)
        else:
            name = job_name(ti.dag_id, ti.run_id, task, ti.try_number)
            # The job id names the attempt (worker_env.ATTEMPT_ENV): its records and result.json say it, so
            # the trigger judges this job on its own, not on an earlier try's in the same run folder.
            spec = JobSpec(name=name, config=config, num_workers=num_workers, controller=self.controller,
                           labels=labels | {"try": str(ti.try_number)}, env={ATTEMPT_ENV: name},
                           avoid_nodes=avoid_nodes)
            job_id = backend.launch(spec)
            self.log.info("launched %s job %s: %d workers, run folder %s%s", backend.kind, job_id, num_workers,
                          self.run_uri, f", keeping off nodes {list(avoid_nodes)}" if avoid_nodes else "")
        self._job_id = job_id
        from ringflow.operators.trigger import TrainJobTrigger

        timeout_at = time.time() + self.job_timeout.total_seconds() if self.job_timeout else None
        self.defer(
            trigger=TrainJobTrigger(backend_kind=backend.kind, backend_kwargs=backend.to_dict(), job_id=job_id,
                                    run_uri=self.run_uri, health=config["health"], conn_id=self.conn_id,
                                    poll_interval=self.poll_interval, timeout_at=timeout_at, attempt=job_id),
            method_name="execute_complete",
        )

    def _workers_now(self, num_workers: int, backend: Backend, avoid_nodes: tuple[str, ...] = ()) -> int:
        """num_workers, or fewer (min_workers and up) when the backend can place fewer now (off the nodes a
        remedy avoids)."""
        if self.min_workers is None:
            return num_workers
        capacity = backend.capacity(num_workers, avoid_nodes)
        workers = workers_to_launch(num_workers, worker_count(self.min_workers), capacity)
        if workers < num_workers:
            self.log.warning("the %s backend can place %d of the %d workers now: launching %d (min_workers %s); "
                             "training resumes on them sample-exact, accumulation and learning rate rescaled",
                             backend.kind, capacity, num_workers, workers, self.min_workers)
        return workers

    def plan(self, try_number: int, run: Any = None) -> TryPlan:
        """Try `try_number`: the task's own config (build_config) with every change the remedies planned up to
        it made (training/core/try_plan.py; the run folder's remedies.jsonl, read from `run` when given, and
        only for a retry under `remediation: "auto"`: the run folder may not exist before the first try)."""
        from ringflow.operators.connections import open_run_folder
        from ringflow.training.formats.config import JobConfig

        def read_planned():
            return planned_remedies(run if run is not None else open_run_folder(self.run_uri, self.conn_id))

        return plan_try(JobConfig.from_dict(self.build_config(self.run_uri, try_number)), try_number, read_planned)

    def _preflight(self, config: dict[str, Any], num_workers: int, backend: Backend) -> None:
        """training/core/preflight.py's check, here for every backend: the manifest is read with this task's
        connection. A custom model factory is checked only where the job runs in this environment (local):
        an MPIJob's code is in its image, and its ranks check the factory when they start."""
        from ringflow.operators.connections import open_store_for
        from ringflow.training.formats.config import JobConfig
        from ringflow.training.formats.manifest import ShardManifest
        from ringflow.training.core.preflight import check_job
        from ringflow.training.store import split_uri

        parent, name = split_uri(config["manifest_uri"])
        manifest = ShardManifest.from_json(open_store_for(parent, self.conn_id).get_bytes(name))
        check_job(JobConfig.from_dict(config), manifest, num_workers, check_factory=backend.kind == LOCAL)

    def execute_complete(self, context, event: dict[str, Any]) -> dict[str, Any]:
        """Decide on what the trigger saw (the failure policy), stop the job when the decision says so, ask
        what comes next (training/core/attempts.py) and record its remedy, then hand on the run folder, its
        plot and its MLflow run, and succeed, retry or fail as decided."""
        self.run_uri = self.run_folder(context)
        try_number = context["ti"].try_number
        seen = Observation.from_dict(event)
        decision = decide(seen)
        message = event.get("message") or decision.reason
        if decision.stop_job:
            message += self._stop_job(event["job_id"], decision.stopped_itself)
        run, records = self._read_run_folder()
        plan = self._known_plan(run, try_number)
        after = self._next_try(seen, decision, run, records, plan, try_number)
        message += after.said
        applied = plan.config.remedies if plan is not None else ()
        plot = self._save_health_plot(run, records, applied)
        self._set_run_links(run, plot_saved=plot is not None)
        mlflow_run_id = self._log_to_mlflow(context, event, run, records,
                                            plan.config.to_dict() if plan is not None else None)
        self._log_health_summary(seen.own_result, decision.verdict, records, applied)
        if after.action != Next.SUCCEED:
            evidence = decision.verdict.evidence if decision.verdict else None
            message += f"; evidence: {json.dumps(evidence, default=str)}" if evidence else ""
            if after.action == Next.FAIL:
                raise AirflowFailException(message)  # a person must change the config: no retry
            raise AirflowException(message)
        result = seen.own_result
        self.log.info("training succeeded: checkpoint %s, step %s, health %s", result.checkpoint, result.step,
                      result.verdict.status if result.verdict else None)
        doc = result.to_dict()
        return {"run_uri": self.run_uri, "job_id": event.get("job_id"), "status": result.status,
                "checkpoint": result.checkpoint, "step": result.step, "loss": doc["loss"],
                "verdict": doc["verdict"], "resumed_from": result.resumed_from, "health_plot": plot,
                "mlflow_run_id": mlflow_run_id, "remedies": doc["remedies"]}

    def _known_plan(self, run: Any, try_number: int) -> TryPlan | None:
        """What the ended try ran with; None when the run folder cannot say (its config is then not known for
        sure, and nothing is remediated)."""
        if run is None:
            return None
        try:
            return self.plan(try_number, run)
        except Exception as exc:  # noqa: BLE001 - the job's own outcome must still decide the task
            self.log.warning("could not read the remedies of earlier tries in %s: %s", self.run_uri, exc)
            return None

    def _next_try(self, seen: Observation, decision: Decision, run: Any, records: list[dict[str, Any]] | None,
                  plan: TryPlan | None, try_number: int) -> NextTry:
        """What comes after this try (training/core/attempts.py; as many tries as the task's retries allow),
        its remedy kept in remedies.jsonl for the next try before the task fails into its retry."""
        def after(known: TryPlan | None) -> NextTry:
            return next_try(seen, decision, known.config if known is not None else None,
                            known.planned if known is not None else (), try_number, None,
                            backend_kind=self._get_backend().kind, num_workers=worker_count(self.num_workers),
                            rank_nodes=rank_nodes(records))

        found = after(plan)
        if found.planned is not None:
            if not recorded(run, found.planned, lambda words: self.log.error("%s", words)):
                return after(None)
            self.log.info("remediation: try %d will run changed after %s: %s", try_number + 1,
                          found.planned.remedy.verdict, found.planned.remedy.words)
        elif found.gave_up:
            self.log.info("remediation: no remedy left after %s: %s", found.remedy.verdict, found.remedy.words)
        return found

    def _log_health_summary(self, result: RunResult | None, verdict: Any,
                            records: list[dict[str, Any]] | None, remedies: Sequence[Mapping[str, Any]]) -> None:
        """The one-screen health summary (core/runs/health_summary.py), last in the log before the outcome."""
        from ringflow.training.core.runs.health_summary import health_summary

        try:
            lines = health_summary(result, verdict, records, remedies)
        except Exception as exc:  # noqa: BLE001 - a summary that cannot be made must not hide the job's outcome
            self.log.warning("could not summarize the run's health: %s", exc)
            return
        for line in lines:
            self.log.info("%s", line)

    def _stop_job(self, job_id: str, stopped_itself: bool) -> str:
        """Stop the job as the policy decided; the words that end the task's message."""
        try:
            self._get_backend().delete(job_id)
        except Exception as exc:  # noqa: BLE001 - the decision's own message must stay the task's error
            self.log.error("could not stop job %s: %s", job_id, exc)
            return f"; stopping job {job_id} failed: {exc}"
        self.log.info("stopped job %s (%s)", job_id, "its teardown" if stopped_itself else "the failure policy")
        return "" if stopped_itself else f"; stopped job {job_id}"

    def _read_run_folder(self) -> tuple[Any, list[dict[str, Any]] | None]:
        """The run folder at run_uri and its health records, read once for the plot, the links and MLflow.
        None for what cannot be read (the folder, or only its records): the job's own outcome still decides."""
        from ringflow.operators.connections import open_run_folder

        try:
            run = open_run_folder(self.run_uri, self.conn_id)
        except Exception as exc:  # noqa: BLE001 - an unreadable folder must not hide the job's own outcome
            self.log.warning("could not open the run folder %s: %s", self.run_uri, exc)
            return None, None
        try:
            return run, run.read_health()
        except Exception as exc:  # noqa: BLE001 - as above; the links and MLflow still get the folder
            self.log.warning("could not read the health records of %s: %s", self.run_uri, exc)
            return run, None

    def _log_to_mlflow(self, context, event: dict[str, Any], run: Any, records: list[dict[str, Any]] | None,
                       config: dict[str, Any] | None) -> str | None:
        """This attempt in MLflow, when mlflow_conn_id is set. A tracking error fails a task whose training
        succeeded (the run must be in MLflow; the retry resumes from the final checkpoint and logs again),
        and is only a warning after a failed training, whose own message must stay the task's error."""
        tracking = MlflowTracking.optional(self.mlflow_conn_id, experiment=self.mlflow_experiment,
                                           conn_id=self.conn_id)
        if tracking is None:
            return None
        try:
            result = RunResult.from_json(event["result"]) if event.get("result") else None
            config = config or self.build_config(self.run_uri, context["ti"].try_number)
            return tracking.log_training(context, run_uri=self.run_uri, job_config=config, result=result,
                                         group_id=getattr(self.task_group, "group_id", None), run_folder=run,
                                         health_records=records)
        except Exception as exc:  # noqa: BLE001 - which exceptions MLflow's client raises is its own business
            message = f"could not log run {self.run_uri} to MLflow (connection {self.mlflow_conn_id!r}): {exc}"
            if event.get("status") == "success":
                raise AirflowException(f"{message}; check the MLflow server and the connection") from exc
            self.log.warning("%s", message)
            return None

    def _save_health_plot(self, run: Any, records: list[dict[str, Any]] | None,
                          remedies: Sequence[Mapping[str, Any]] = ()) -> str | None:
        import os
        import tempfile

        from ringflow.training.core.runs.health_plot import save_health_plot

        if not records:
            return None
        try:
            with tempfile.TemporaryDirectory() as tmp:
                location = run.write_health_plot(save_health_plot(records, os.path.join(tmp, "health.png"),
                                                                  remedies=remedies))
        except Exception as exc:  # noqa: BLE001 - a missing plot must not hide the job's own outcome
            self.log.warning("could not save the health plot: %s", exc)
            return None
        self.log.info("health plot saved: %s", location)
        return location

    def _set_run_links(self, run: Any, *, plot_saved: bool) -> None:
        from ringflow.training.core.runs import store_layout

        try:
            self.run_links = run_links(self.run_uri, plot_saved=plot_saved, conn_id=self.conn_id,
                                       store_root=store_layout.default_store_uri(), base_path=api_base_path(),
                                       run_folder=run)
        except Exception as exc:  # noqa: BLE001 - a link that cannot be built must not fail the training
            self.log.warning("no extra links for run folder %s: %s", self.run_uri, exc)

    def on_kill(self) -> None:
        # Before deferral the job is ours to stop; once deferred, the trigger's on_kill stops it.
        if self._job_id:
            self._get_backend().delete(self._job_id)
