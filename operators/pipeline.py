"""The whole pipeline as one TaskGroup: validate >> shard >> train >> evaluate >> promote.

    from ringflow.operators.pipeline import ringflow_pipeline

    with DAG("my_dag", params={...}):
        ringflow_pipeline("digits", dataset_uri="builtin:digits", model_name="digits-mlp",
                          epochs=5, batch_size=32, learning_rate=0.002, suite="suites/digits.json")

Arguments may be plain values or templates of one expression (`"{{ params.epochs }}"`), so a DAG can
drive them from its Params. The factory works with and without `render_template_as_native_obj`.

What flows between the tasks (XCom):
    shard    -> train     `manifest_uri` of the shards (a deterministic folder; see shard.py)
    train    -> evaluate  `run_uri`: runs/<dag_id>/<run_id>/<group_id>/ under the store (layout.py)
    train    -> promote   `run_uri`; promote reads result.json and eval.json there itself

Every part is usable on its own, outside the group, with the same arguments:
    ValidateDatasetOperator(task_id=..., dataset_uri=..., suite=...)                      validate.py
    ShardDatasetOperator(task_id=..., dataset_uri=..., output_uri=layout.shards_root(store),
                         num_workers=2, batch_size=32)        -> XCom {"manifest_uri", ...}   shard.py
    HorovodTrainOperator(task_id=..., manifest_uri=..., run_uri=layout.run_uri(store, dag, run),
                         job_config={"epochs": 5})            -> XCom {"run_uri", ...}        train.py
    EvaluateModelOperator(task_id=..., run_uri=...)           -> XCom {"metrics", ...}        evaluate.py
    PromoteModelOperator(task_id=..., name=..., store_uri=store, run_uri=...)                 promote.py
and `pipeline_tasks()` below returns the five operators without the group, to rewire them.

Injected faults (`job_config` "faults", tests only) apply on the first try of the train task only: a
retry resumes from the last checkpoint and shows the recovery instead of crashing at the same step again.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Mapping, Sequence

from airflow.sdk import TaskGroup

from ringflow.operators import layout
from ringflow.operators.connections import DEFAULT_CONN_ID
from ringflow.operators.evaluate import EvaluateModelOperator
from ringflow.operators.promote import DEFAULT_ALLOWED_VERDICTS, Gate, PromoteModelOperator
from ringflow.operators.kubernetes.backend import backend_from_env
from ringflow.operators.shard import ShardDatasetOperator
from ringflow.operators.train import HorovodTrainOperator
from ringflow.operators.validate import ValidateDatasetOperator
from ringflow.training.launcher import DEFAULT_CONTROLLER

_ONE_EXPRESSION = re.compile(r"^\s*\{\{(.*)\}\}\s*$", re.S)
DEFAULT_GATE: Mapping[str, Any] = {"metric": "accuracy", "mode": "max", "threshold": None,
                                   "compare_to_production": True}


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _expression(value: Any, what: str) -> str:
    """A Jinja expression for `value`: the inside of a one-expression template, or the value as a literal."""
    if _is_template(value):
        match = _ONE_EXPRESSION.match(value)
        if not match or "{{" in match.group(1) or "{%" in match.group(1):
            raise ValueError(f"{what} is {value!r}: give a plain value or one expression like '{{{{ params.{what} }}}}'")
        return f"({match.group(1).strip()})"
    if isinstance(value, (dict, list, tuple, str, int, float, bool)) or value is None:
        return repr(value)  # Jinja reads Python literals of plain data
    raise TypeError(f"{what} must be plain JSON-like data or a template, got {type(value).__name__}")


def job_config_template(*, epochs: Any, batch_size: Any, learning_rate: Any, overrides: Any = None) -> str:
    """The train task's `job_config` as a template rendering to JSON: epochs, batch size and learning rate,
    then `overrides` (a dict, or one expression such as `{{ params.job_overrides }}`) on top, faults kept on
    the task's first try only."""
    return (
        "{%- set cfg = dict(epochs=" + _expression(epochs, "epochs")
        + ", batch_size=" + _expression(batch_size, "batch_size")
        + ", learning_rate=" + _expression(learning_rate, "learning_rate") + ") -%}"
        "{%- set cfg = dict(cfg, **(" + _expression(overrides or {}, "job_config") + " or {})) -%}"
        "{{ dict(cfg, faults=(cfg.get('faults') or [] if ti.try_number <= 1 else [])) | tojson }}"
    )


def default_suite_for(target: str) -> dict[str, Any]:
    """The checks any dataset passes before it may be sharded, when the DAG gives no suite of its own."""
    return {"name": "ringflow-minimal", "expectations": [
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
        {"type": "expect_column_to_exist", "kwargs": {"column": target}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": target}},
    ]}


class GatedPromoteModelOperator(PromoteModelOperator):
    """PromoteModelOperator whose gate (metric, mode, threshold) may come from templates, i.e. DAG Params.
    The gate is checked again, with the rendered values, when the task runs."""

    template_fields: Sequence[str] = (*PromoteModelOperator.template_fields, "gate_metric", "gate_mode",
                                      "gate_threshold")

    def __init__(self, *, metric: str = "accuracy", mode: str = "max", threshold: Any = None, **kwargs: Any):
        self.gate_metric, self.gate_mode, self.gate_threshold = metric, mode, threshold
        plain = {k: v for k, v in (("metric", metric), ("mode", mode), ("threshold", threshold)) if not _is_template(v)}
        super().__init__(**plain, **kwargs)  # checks the plain values now, at parse time

    def execute(self, context: Any) -> dict[str, Any]:
        threshold = self.gate_threshold
        if isinstance(threshold, str):
            threshold = None if threshold.strip() in ("", "None", "null") else float(threshold)
        self.gate = Gate(metric=str(self.gate_metric), mode=str(self.gate_mode), threshold=threshold,
                         compare_to_production=self.gate.compare_to_production,
                         allowed_verdicts=self.gate.allowed_verdicts)
        return super().execute(context)


def pipeline_tasks(*, dataset_uri: Any, model_name: Any, store_uri: str | None = None, num_workers: Any = 2,
                   epochs: Any, batch_size: Any, learning_rate: Any,
                   suite: Sequence[Mapping] | Mapping | str | None = None, gate: Mapping[str, Any] | None = None,
                   job_config: Any = None, conn_id: str | None = None, backend: Any = None,
                   target: str = "target", seed: Any = 0, eval_fraction: Any = 0.2, controller: str = DEFAULT_CONTROLLER,
                   train_retries: int = 1, train_retry_delay: dt.timedelta = dt.timedelta(seconds=30),
                   job_timeout: dt.timedelta | None = None, pipeline_id: str | None = None) -> dict[str, Any]:
    """The five operators, wired (validate >> shard >> train >> evaluate >> promote), in the current DAG or
    TaskGroup context. Returns them by step name."""
    store = store_uri or layout.default_store_uri()
    conn = conn_id or DEFAULT_CONN_ID
    gate = {**DEFAULT_GATE, **(gate or {})}

    validate = ValidateDatasetOperator(task_id="validate", dataset_uri=dataset_uri,
                                       suite=suite if suite is not None else default_suite_for(target),
                                       conn_id=conn)
    shard = ShardDatasetOperator(task_id="shard", dataset_uri=dataset_uri, output_uri=layout.shards_root(store),
                                 num_workers=num_workers, batch_size=batch_size, seed=seed,
                                 eval_fraction=eval_fraction, target=target, conn_id=conn)
    train = HorovodTrainOperator(
        task_id="train",
        manifest_uri=f"{{{{ ti.xcom_pull(task_ids='{shard.task_id}')['manifest_uri'] }}}}",
        run_uri=layout.run_uri_template(store, pipeline_id),
        num_workers=num_workers,
        job_config=job_config_template(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                                       overrides=job_config),
        # No backend given: what the deployment configured (MPIJobs via $RINGFLOW_MPIJOB_SETTINGS), else local.
        backend=backend if backend is not None else backend_from_env(), controller=controller, conn_id=conn,
        job_timeout=job_timeout, retries=train_retries, retry_delay=train_retry_delay,
    )
    run_uri = f"{{{{ ti.xcom_pull(task_ids='{train.task_id}')['run_uri'] }}}}"
    evaluate = EvaluateModelOperator(task_id="evaluate", run_uri=run_uri, conn_id=conn)
    promote = GatedPromoteModelOperator(
        task_id="promote", name=model_name, store_uri=store, run_uri=run_uri, conn_id=conn,
        metric=gate["metric"], mode=gate["mode"], threshold=gate.get("threshold"),
        compare_to_production=gate.get("compare_to_production", True),
        allowed_verdicts=gate.get("allowed_verdicts", DEFAULT_ALLOWED_VERDICTS),
        fail_on_gate=gate.get("fail_on_gate", False),
    )
    validate >> shard >> train >> evaluate >> promote
    return {"validate": validate, "shard": shard, "train": train, "evaluate": evaluate, "promote": promote}


def ringflow_pipeline(group_id: str, *, dataset_uri: Any, model_name: Any, store_uri: str | None = None,
                      num_workers: Any = 2, epochs: Any, batch_size: Any, learning_rate: Any,
                      suite: Sequence[Mapping] | Mapping | str | None = None,
                      gate: Mapping[str, Any] | None = None, job_config: Any = None, conn_id: str | None = None,
                      backend: Any = None, tooltip: str | None = None, **options: Any) -> TaskGroup:
    """validate >> shard >> train >> evaluate >> promote as the TaskGroup `group_id`.

    dataset_uri: `builtin:<name>`, or a .csv/.parquet path, file:// or s3:// URI.
    store_uri: the base of shards/, runs/ and models/ (default: layout.default_store_uri(), i.e.
        $RINGFLOW_STORE or $AIRFLOW_HOME/ringflow-data). S3 goes through the Airflow connection `conn_id`
        (default `ringflow_s3`).
    suite: Great Expectations suite (list, dict, or JSON path relative to the DAG file); default: rows
        present and a non-null target.
    gate: {"metric", "mode" ("max"|"min"), "threshold", "compare_to_production", "allowed_verdicts",
        "fail_on_gate"}; metric, mode and threshold may be templates.
    job_config: overrides of the training config (dict or one template expression rendering to a dict).
    backend: where training runs (default: MPIJobs when $RINGFLOW_MPIJOB_SETTINGS is set, as the Helm
        values in deploy/ do; else local horovodrun processes).
    options: target, seed, eval_fraction, controller, train_retries (default 1: a crashed job resumes from
        its last checkpoint), train_retry_delay, job_timeout.
    """
    with TaskGroup(group_id=group_id, tooltip=tooltip or f"validate >> shard >> train >> evaluate >> promote "
                                                         f"({group_id})") as group:
        pipeline_tasks(dataset_uri=dataset_uri, model_name=model_name, store_uri=store_uri,
                       num_workers=num_workers, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                       suite=suite, gate=gate, job_config=job_config, conn_id=conn_id, backend=backend,
                       pipeline_id=group_id, **options)
    return group
