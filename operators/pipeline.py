"""The whole pipeline as one TaskGroup: validate >> shard >> train >> evaluate >> promote.

    from ringflow.operators.pipeline import ringflow_pipeline

    with DAG("my_dag", params={...}):
        ringflow_pipeline("digits", model_name="digits-mlp",
                          data=DataSpec("builtin:digits", suite="suites/digits.json"),
                          training=TrainingSpec(epochs=5, batch_size=32, learning_rate=0.002))

The arguments come in four typed groups (pipeline_specs.py), checked when the DAG is parsed: DataSpec (what
data), TrainingSpec (how to train), GateSpec (when to promote, and whether a person approves) and
TrackingSpec (MLflow), beside model_name, store_uri and conn_id.

Arguments may be plain values or templates (`"{{ params.epochs }}"`), so a DAG can drive them from its
Params: each operator takes them as template fields and checks the rendered values when it runs (text
from a template is read as a number, a dict, or None where the argument wants one). The factory only
composes; it works with and without `render_template_as_native_obj`.

What flows between the tasks (XCom):
    shard    -> train     `manifest_uri` of the shards (a deterministic folder; see shard.py)
    train    -> evaluate  `run_uri`: runs/<dag_id>/<run_id>/<group_id>/ under the store, derived by the train
                          task when it runs (store_layout.run_uri)
    train    -> promote   `run_uri`; promote reads result.json and eval.json there itself

Every part is usable on its own, outside the group, with the same arguments:
    ValidateDatasetOperator(task_id=..., dataset_uri=..., suite=...)                      validate.py
    ShardDatasetOperator(task_id=..., dataset_uri=..., output_uri=store_layout.shards_root(store),
                         num_partitions=2, batch_size=32)     -> XCom {"manifest_uri", ...}   shard.py
    TrainOperator(task_id=..., manifest_uri=..., store_uri=store, epochs=5)
                                                              -> XCom {"run_uri", ...}        train.py
    EvaluateModelOperator(task_id=..., run_uri=...)           -> XCom {"metrics", ...}        evaluate.py
    PromoteModelOperator(task_id=..., name=..., store_uri=store, run_uri=..., metric=..., mode=...)
                                                                                          promote.py
and `pipeline_tasks()` below returns the five operators without the group, to rewire them.

Injected faults (`job_config` "faults", tests only) apply on the try of the train task they name (`on_try`,
the first by default; the train operator keeps only that try's). A DAG's trigger form never offers them: its overrides Param uses
JOB_OVERRIDES_SCHEMA below.
"""
from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk import TaskGroup

from ringflow.operators.approval import PromotionApprovalOperator
from ringflow.operators.connections import DEFAULT_S3_CONN_ID
from ringflow.operators.evaluate import EvaluateModelOperator
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrackingSpec, TrainingSpec
from ringflow.operators.promote import PromoteModelOperator
from ringflow.operators.shard import ShardDatasetOperator
from ringflow.operators.train import TrainOperator
from ringflow.operators.validate import ValidateDatasetOperator
from ringflow.training.core.backends.kubernetes.mpijob_backend import backend_from_env
from ringflow.training.formats.config import PRECISIONS
from ringflow.training.formats.engines import TABLE as ENGINE_TABLE
from ringflow.training.core.runs import store_layout

# The JSON schema of a production trigger form's training-config overrides (a DAG's `job_overrides` Param):
# how the job trains, never where it reads or writes (the operator owns manifest_uri and run_uri),
# what code it imports (no custom model factory) or injected faults (tests only). Names only: the values are
# checked by JobConfig when the train task builds the config.
JOB_OVERRIDES_SCHEMA: Mapping[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "checkpoint": {"type": "object", "additionalProperties": False,
                       "properties": {"every_steps": {"type": "integer"}, "keep_last": {"type": "integer"},
                                      "min_interval_seconds": {"type": "number"}}},
        "model": {"type": "object", "additionalProperties": False,
                  "properties": {"kind": {"const": "mlp"}, "hidden": {"type": "array", "items": {"type": "integer"}},
                                 "dropout": {"type": "number"}}},
        "optimizer": {"type": "string"}, "seed": {"type": "integer"}, "log_every_steps": {"type": "integer"},
        "gc_every_steps": {"type": "integer"}, "precision": {"enum": list(PRECISIONS)},
        "health": {"type": "object"},
        # Each engine's own section (the engine table's config_section), so a new engine's knobs are offered.
        **{spec.config_section: {"type": "object"} for spec in ENGINE_TABLE.values()},
    },
}


def default_suite_for(target: str) -> dict[str, Any]:
    """The checks any dataset passes before it may be sharded, when the DAG gives no suite of its own."""
    return {"name": "ringflow-minimal", "expectations": [
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
        {"type": "expect_column_to_exist", "kwargs": {"column": target}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": target}},
    ]}


def pipeline_tasks(*, data: DataSpec, training: TrainingSpec, model_name: Any, gate: GateSpec = GateSpec(),
                   tracking: TrackingSpec = TrackingSpec(), store_uri: str | None = None,
                   conn_id: str | None = DEFAULT_S3_CONN_ID) -> dict[str, Any]:
    """The five operators (six with approval), wired (validate >> shard >> train >> evaluate >> promote), in
    the current DAG or TaskGroup context. Returns them by step name.

    model_name: the registry name (templated). store_uri: the base of shards/, runs/ and models/ (default:
    store_layout.default_store_uri(), i.e. $RINGFLOW_STORE or $AIRFLOW_HOME/ringflow-data). conn_id: the
    Airflow connection S3 goes through (default `ringflow_s3`; None: the S3 variables of the environment;
    connections.py). The groups: pipeline_specs.py."""
    store = store_uri or store_layout.default_store_uri()
    validate = ValidateDatasetOperator(task_id="validate", dataset_uri=data.dataset_uri,
                                       suite=data.suite if data.suite is not None else default_suite_for(data.target),
                                       target=data.target, conn_id=conn_id)
    shard = ShardDatasetOperator(task_id="shard", dataset_uri=data.dataset_uri,
                                 output_uri=store_layout.shards_root(store), num_partitions=training.num_workers,
                                 batch_size=training.batch_size, seed=data.seed, eval_fraction=data.eval_fraction,
                                 target=data.target, conn_id=conn_id)
    train = train_operator(training, tracking, store_uri=store, conn_id=conn_id, shard_task_id=shard.task_id,
                           job_config=training.job_config)
    run_uri = f"{{{{ ti.xcom_pull(task_ids='{train.task_id}')['run_uri'] }}}}"
    evaluate = EvaluateModelOperator(task_id="evaluate", run_uri=run_uri, conn_id=conn_id,
                                     mlflow_conn_id=tracking.mlflow_conn_id)
    promote = PromoteModelOperator(
        task_id="promote", name=model_name, store_uri=store, run_uri=run_uri, conn_id=conn_id,
        **gate_arguments(gate), fail_on_gate=gate.fail_on_gate,
        mlflow_conn_id=tracking.mlflow_conn_id, mlflow_alias=tracking.alias,
    )
    if not gate.require_approval:
        validate >> shard >> train >> evaluate >> promote
        return {"validate": validate, "shard": shard, "train": train, "evaluate": evaluate, "promote": promote}
    # A person answers between evaluate and promote, shown the gate promote applies (approval.py).
    approve = PromotionApprovalOperator(
        task_id="approve", name=model_name, store_uri=store, run_uri=run_uri, conn_id=conn_id,
        **gate_arguments(gate), response_timeout=gate.approval_timeout, approvers=gate.approvers,
    )
    validate >> shard >> train >> evaluate >> approve >> promote
    return {"validate": validate, "shard": shard, "train": train, "evaluate": evaluate, "approve": approve,
            "promote": promote}


def gate_arguments(gate: GateSpec) -> dict[str, Any]:
    """The gate's arguments as promote, its approval and a sweep's selection take them (GateArguments)."""
    return dict(metric=gate.metric, mode=gate.mode, threshold=gate.threshold,
                compare_to_production=gate.compare_to_production, allowed_verdicts=gate.allowed_verdicts)


def train_operator(training: TrainingSpec, tracking: TrackingSpec, *, store_uri: str, conn_id: str | None,
                   shard_task_id: str, job_config: Any) -> TrainOperator:
    """The train task of a pipeline (or of a sweep's candidate, whose job_config is its configuration): the
    shards from the shard task's XCom, the run folder derived under `store_uri` when the task runs."""
    return TrainOperator(
        task_id="train",
        manifest_uri=f"{{{{ ti.xcom_pull(task_ids='{shard_task_id}')['manifest_uri'] }}}}",
        store_uri=store_uri,  # the run folder: runs/<dag_id>/<run_id>/<group_id>/ (train.train_run_uri)
        num_workers=training.num_workers, epochs=training.epochs, batch_size=training.batch_size,
        learning_rate=training.learning_rate, engine=training.engine, job_config=job_config,
        # No backend given: what the deployment configured ($RINGFLOW_MPIJOB_SETTINGS/_TRAINJOB_SETTINGS), else local.
        backend=training.backend if training.backend is not None else backend_from_env(),
        controller=training.controller, conn_id=conn_id, job_timeout=training.job_timeout,
        retries=training.retries, retry_delay=training.retry_delay, mlflow_conn_id=tracking.mlflow_conn_id,
        entry=training.entry, scripts_dir=training.scripts_dir,
    )


def ringflow_pipeline(group_id: str, *, data: DataSpec, training: TrainingSpec, model_name: Any,
                      gate: GateSpec = GateSpec(), tracking: TrackingSpec = TrackingSpec(),
                      store_uri: str | None = None, conn_id: str | None = DEFAULT_S3_CONN_ID,
                      tooltip: str | None = None) -> TaskGroup:
    """validate >> shard >> train >> evaluate >> promote (evaluate >> approve >> promote when
    gate.require_approval) as the TaskGroup `group_id`; the other arguments are pipeline_tasks'."""
    steps = "evaluate >> approve >> promote" if gate.require_approval else "evaluate >> promote"
    with TaskGroup(group_id=group_id, tooltip=tooltip or f"validate >> shard >> train >> {steps} ({group_id})") as group:
        pipeline_tasks(data=data, training=training, model_name=model_name, gate=gate, tracking=tracking,
                       store_uri=store_uri, conn_id=conn_id)
    return group
