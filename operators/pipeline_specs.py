"""The pipeline factory's arguments in four typed groups: what data (DataSpec), how to train (TrainingSpec),
when to promote (GateSpec) and where to track (TrackingSpec).

Each is a frozen dataclass checked in `__post_init__`, so a wrong value fails when the DAG file is parsed and
the message names the field and the fix. A field the operators render (dataset_uri, epochs, batch_size,
learning_rate, num_workers, engine, job_config, seed, eval_fraction; the gate's metric, mode, threshold) may
also be a template (`"{{ params.epochs }}"`): it is checked when the task runs, as the operator renders it.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
from typing import Any, Mapping, Sequence

from ringflow.operators.approval import DEFAULT_APPROVAL_TIMEOUT, check_timeout
from ringflow.operators.promote import is_template
from ringflow.training.core.gate import DEFAULT_ALLOWED_VERDICTS, build_gate
from ringflow.operators.train import check_overrides
from ringflow.training.formats.engines import ENGINES
from ringflow.training.formats.engines import CONTROLLERS, DEFAULT_CONTROLLER
from ringflow.training.core.tracking.settings import DEFAULT_ALIAS, check_alias


def _number(spec: str, name: str, value: Any, *, kind: type, low: float, low_open: bool = False,
            high: float | None = None) -> None:
    """`value` is a template, or a number of `kind` in [low, high) ((low, ...) when low_open)."""
    if is_template(value):
        return
    ok = not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
    ok = ok and not (isinstance(value, float) and math.isnan(value))
    ok = ok and (value > low if low_open else value >= low) and (high is None or value < high)
    if not ok:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        within = f" and < {high:g}" if high is not None else ""
        raise ValueError(f"{spec}.{name} is {value!r}; give a {'whole number' if kind is int else 'number'} "
                         f"{bound}{within}, or a template rendering to one (e.g. '{{{{ params.{name} }}}}')")


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """dataset_uri: `builtin:<name>`, or a .csv/.parquet path, file:// or s3:// URI (templated).
    suite: Great Expectations suite (list, dict, or JSON path relative to the DAG file); None: rows present
        and a non-null target. target: the label column. seed, eval_fraction: the shard step's."""

    dataset_uri: str
    suite: Sequence[Mapping] | Mapping | str | None = None
    target: str = "target"
    seed: int | str = 0
    eval_fraction: float | str = 0.2

    def __post_init__(self) -> None:
        if not isinstance(self.dataset_uri, str) or not self.dataset_uri.strip():
            raise ValueError(f"DataSpec.dataset_uri is {self.dataset_uri!r}; give 'builtin:<name>', a .csv/.parquet "
                             f"path, file:// or s3:// URI, or a template rendering to one")
        if self.suite is not None and not isinstance(self.suite, (list, tuple, dict, str)):
            raise ValueError(f"DataSpec.suite is a {type(self.suite).__name__}; give a list or dict of expectations, "
                             f"a JSON file path, or None for the minimal suite")
        if not isinstance(self.target, str) or not self.target:
            raise ValueError(f"DataSpec.target is {self.target!r}; name the label column, e.g. 'target'")
        _number("DataSpec", "seed", self.seed, kind=int, low=0)
        _number("DataSpec", "eval_fraction", self.eval_fraction, kind=float, low=0, high=1)


@dataclasses.dataclass(frozen=True)
class TrainingSpec:
    """epochs, batch_size (per worker; also the shards'), learning_rate, num_workers: templated.
    engine: one of the engine table's (formats/engines.py: "horovod", "ddp", "tensorflow"; templated; None: the
    config's default, or what job_config says).
    job_config: overrides of the training config, applied last (a dict, or a template rendering to one).
    backend: where training runs (None: what the deployment configured, backend_from_env; else local).
    controller: local runs' "gloo" or "mpi". retries (default 1: a crashed job resumes from its last
    checkpoint), retry_delay, job_timeout (None: no limit): the train task's.
    entry: the user's own training script instead of ringflow's loop: {"script": "train.py", "args": [...],
    "folder": ...} (its values templated); each try pins the folder's bundle into the run folder (train.py).
    scripts_dir: the folder of script folders entry's folder names one of (a trigger form's pick, never a path;
    relative: to the DAG file's folder)."""

    epochs: int | str
    batch_size: int | str
    learning_rate: float | str
    num_workers: int | str = 2
    engine: str | None = None
    job_config: Mapping[str, Any] | str | None = None
    backend: Any = None
    controller: str = DEFAULT_CONTROLLER
    retries: int = 1
    retry_delay: dt.timedelta = dt.timedelta(seconds=30)
    job_timeout: dt.timedelta | None = None
    entry: Mapping[str, Any] | None = None
    scripts_dir: str | None = None

    def __post_init__(self) -> None:
        _check_entry(self.entry, self.scripts_dir)
        for name in ("epochs", "batch_size", "num_workers"):
            _number("TrainingSpec", name, getattr(self, name), kind=int, low=1)
        _number("TrainingSpec", "learning_rate", self.learning_rate, kind=float, low=0, low_open=True)
        if self.engine is not None and not is_template(self.engine) and self.engine not in ENGINES:
            raise ValueError(f"TrainingSpec.engine is {self.engine!r}; use one of {ENGINES}, a template, or None")
        if isinstance(self.job_config, Mapping):
            check_overrides(dict(self.job_config))
        elif self.job_config is not None and not is_template(self.job_config):
            raise ValueError(f"TrainingSpec.job_config is {self.job_config!r}; give a dict of config overrides or a "
                             f"template rendering to one (e.g. '{{{{ params.job_overrides }}}}')")
        if self.controller not in CONTROLLERS:
            raise ValueError(f"TrainingSpec.controller is {self.controller!r}; use one of {CONTROLLERS}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"TrainingSpec.retries is {self.retries!r}; give a whole number >= 0")
        if not isinstance(self.retry_delay, dt.timedelta) or self.retry_delay < dt.timedelta(0):
            raise ValueError(f"TrainingSpec.retry_delay is {self.retry_delay!r}; give a datetime.timedelta >= 0")
        if self.job_timeout is not None and (not isinstance(self.job_timeout, dt.timedelta)
                                             or self.job_timeout <= dt.timedelta(0)):
            raise ValueError(f"TrainingSpec.job_timeout is {self.job_timeout!r}; give a positive datetime.timedelta, "
                             f"or None for no limit")


ENTRY_KEYS = ("script", "args", "folder")


def _check_entry(entry: Any, scripts_dir: Any) -> None:
    """TrainingSpec's entry and scripts_dir, as far as they are known when the DAG is parsed (templates are
    checked when the task renders them)."""
    from ringflow.training.formats.code_bundle import script_folder
    from ringflow.training.formats.config import EntryConfig

    if scripts_dir is not None and (not isinstance(scripts_dir, str) or not scripts_dir or entry is None):
        raise ValueError(f"TrainingSpec.scripts_dir is {scripts_dir!r} with entry {entry!r}; give the folder of "
                         "script folders as a path, with an entry whose folder names one of them")
    if entry is None:
        return
    if not isinstance(entry, Mapping) or not set(entry) <= set(ENTRY_KEYS) or "script" not in entry:
        raise ValueError(f"TrainingSpec.entry is {entry!r}; give a dict with {list(ENTRY_KEYS)} (script required; "
                         "the launch pins the bundle's sha256 itself)")
    args = entry.get("args") or ()
    if any(is_template(v) for v in (entry.get("script"), entry.get("folder"), args,
                                    *(args if isinstance(args, (list, tuple)) else ()))):
        return
    EntryConfig(script=entry["script"], args=entry.get("args", ()), folder=entry.get("folder"))
    if scripts_dir is not None and os.path.isabs(scripts_dir):
        script_folder(scripts_dir, str(entry.get("folder") or ""), entry["script"])


@dataclasses.dataclass(frozen=True)
class GateSpec:
    """When a run may replace production (promote.Gate's fields; metric, mode and threshold templated), and
    who decides: fail_on_gate (a refusal fails the promote task), require_approval (evaluate >> approve >>
    promote: a person answers, approval.py), approval_timeout (None waits for ever), approvers (user ids;
    None: anyone who may edit the DAG's HITL details)."""

    metric: str = "accuracy"
    mode: str = "max"
    threshold: float | str | None = None
    compare_to_production: bool = True
    allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS
    fail_on_gate: bool = False
    require_approval: bool = False
    approval_timeout: dt.timedelta | None = DEFAULT_APPROVAL_TIMEOUT
    approvers: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not any(is_template(v) for v in (self.metric, self.mode, self.threshold)):
            build_gate(metric=self.metric, mode=self.mode, threshold=self.threshold,
                       compare_to_production=self.compare_to_production, allowed_verdicts=self.allowed_verdicts)
        for name in ("compare_to_production", "fail_on_gate", "require_approval"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GateSpec.{name} is {getattr(self, name)!r}; use True or False")
        check_timeout(self.approval_timeout)
        if self.approvers is not None and (isinstance(self.approvers, str)
                                           or not all(isinstance(a, str) and a for a in self.approvers)):
            raise ValueError(f"GateSpec.approvers is {self.approvers!r}; give a list of user ids, or None")


@dataclasses.dataclass(frozen=True)
class TrackingSpec:
    """mlflow_conn_id: an MLflow server's Airflow connection (type http): every training run becomes an MLflow
    run, a promotion registers a model version and moves `alias`; None (the default): no MLflow, not imported
    (operators/tracking.py)."""

    mlflow_conn_id: str | None = None
    alias: str = DEFAULT_ALIAS

    def __post_init__(self) -> None:
        if self.mlflow_conn_id is not None and (not isinstance(self.mlflow_conn_id, str)
                                                or not self.mlflow_conn_id.strip()):
            raise ValueError(f"TrackingSpec.mlflow_conn_id is {self.mlflow_conn_id!r}; name an Airflow connection "
                             f"of type http, or None for no MLflow")
        check_alias(self.alias)
