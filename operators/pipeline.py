"""The whole pipeline as one TaskGroup: validate >> shard >> train >> evaluate >> promote.

    from ringflow.operators.pipeline import ringflow_pipeline

    with DAG("my_dag", params={...}):
        ringflow_pipeline("digits", dataset_uri="builtin:digits", model_name="digits-mlp",
                          epochs=5, batch_size=32, learning_rate=0.002, suite="suites/digits.json")

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
                         num_workers=2, batch_size=32)        -> XCom {"manifest_uri", ...}   shard.py
    HorovodTrainOperator(task_id=..., manifest_uri=..., store_uri=store, epochs=5)
                                                              -> XCom {"run_uri", ...}        train.py
    EvaluateModelOperator(task_id=..., run_uri=...)           -> XCom {"metrics", ...}        evaluate.py
    PromoteModelOperator(task_id=..., name=..., store_uri=store, run_uri=..., metric=..., mode=...)
                                                                                          promote.py
and `pipeline_tasks()` below returns the five operators without the group, to rewire them.

Injected faults (`job_config` "faults", tests only) apply on the first try of the train task only (the
train operator drops them on a retry). A DAG's trigger form never offers them: its overrides Param uses
JOB_OVERRIDES_SCHEMA below.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping, Sequence

from airflow.sdk import TaskGroup

from ringflow.operators.approval import DEFAULT_APPROVAL_TIMEOUT, PromotionApprovalOperator
from ringflow.operators.connections import DEFAULT_CONN_ID
from ringflow.operators.evaluate import EvaluateModelOperator
from ringflow.operators.promote import PromoteModelOperator
from ringflow.training.core.gate import DEFAULT_ALLOWED_VERDICTS
from ringflow.operators.shard import ShardDatasetOperator
from ringflow.operators.train import HorovodTrainOperator
from ringflow.operators.validate import ValidateDatasetOperator
from ringflow.training.backends.kubernetes.backend import backend_from_env
from ringflow.training.config import PRECISIONS
from ringflow.training.launcher import DEFAULT_CONTROLLER
from ringflow.training.runs import store_layout
from ringflow.training.tracking.settings import DEFAULT_ALIAS

DEFAULT_GATE: Mapping[str, Any] = {"metric": "accuracy", "mode": "max", "threshold": None,
                                   "compare_to_production": True}


# The JSON schema of a production trigger form's training-config overrides (a DAG's `job_overrides` Param):
# how the job trains, never where it reads or writes (the operator owns manifest_uri and run_uri),
# what code it imports (no custom model factory) or injected faults (tests only). Names only: the values are
# checked by JobConfig when the train task builds the config.
JOB_OVERRIDES_SCHEMA: Mapping[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "checkpoint": {"type": "object", "additionalProperties": False,
                       "properties": {"every_steps": {"type": "integer"}, "keep_last": {"type": "integer"}}},
        "model": {"type": "object", "additionalProperties": False,
                  "properties": {"kind": {"const": "mlp"}, "hidden": {"type": "array", "items": {"type": "integer"}},
                                 "dropout": {"type": "number"}}},
        "optimizer": {"type": "string"}, "seed": {"type": "integer"}, "log_every_steps": {"type": "integer"},
        "gc_every_steps": {"type": "integer"}, "precision": {"enum": list(PRECISIONS)},
        "health": {"type": "object"}, "horovod": {"type": "object"}, "ddp": {"type": "object"},
    },
}


def default_suite_for(target: str) -> dict[str, Any]:
    """The checks any dataset passes before it may be sharded, when the DAG gives no suite of its own."""
    return {"name": "ringflow-minimal", "expectations": [
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
        {"type": "expect_column_to_exist", "kwargs": {"column": target}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": target}},
    ]}


def pipeline_tasks(*, dataset_uri: Any, model_name: Any, store_uri: str | None = None, num_workers: Any = 2,
                   epochs: Any, batch_size: Any, learning_rate: Any,
                   suite: Sequence[Mapping] | Mapping | str | None = None, gate: Mapping[str, Any] | None = None,
                   job_config: Any = None, engine: Any = None, conn_id: str | None = DEFAULT_CONN_ID,
                   backend: Any = None, target: str = "target", seed: Any = 0, eval_fraction: Any = 0.2,
                   controller: str = DEFAULT_CONTROLLER,
                   mlflow_conn_id: str | None = None, mlflow_alias: str = DEFAULT_ALIAS,
                   train_retries: int = 1, train_retry_delay: dt.timedelta = dt.timedelta(seconds=30),
                   job_timeout: dt.timedelta | None = None, require_approval: bool = False,
                   approval_timeout: dt.timedelta | None = DEFAULT_APPROVAL_TIMEOUT,
                   approvers: Sequence[str] | None = None) -> dict[str, Any]:
    """The five operators, wired (validate >> shard >> train >> evaluate >> promote), in the current DAG or
    TaskGroup context. Returns them by step name."""
    store = store_uri or store_layout.default_store_uri()
    conn = conn_id  # None: no connection, the environment's S3 settings (connections.py)
    gate = {**DEFAULT_GATE, **(gate or {})}

    validate = ValidateDatasetOperator(task_id="validate", dataset_uri=dataset_uri,
                                       suite=suite if suite is not None else default_suite_for(target),
                                       target=target, conn_id=conn)
    shard = ShardDatasetOperator(task_id="shard", dataset_uri=dataset_uri, output_uri=store_layout.shards_root(store),
                                 num_workers=num_workers, batch_size=batch_size, seed=seed,
                                 eval_fraction=eval_fraction, target=target, conn_id=conn)
    train = HorovodTrainOperator(
        task_id="train",
        manifest_uri=f"{{{{ ti.xcom_pull(task_ids='{shard.task_id}')['manifest_uri'] }}}}",
        store_uri=store,  # the run folder: runs/<dag_id>/<run_id>/<group_id>/, derived when the task runs
        num_workers=num_workers, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
        engine=engine, job_config=job_config,
        # No backend given: what the deployment configured ($RINGFLOW_MPIJOB_SETTINGS/_TRAINJOB_SETTINGS), else local.
        backend=backend if backend is not None else backend_from_env(), controller=controller, conn_id=conn,
        job_timeout=job_timeout, retries=train_retries, retry_delay=train_retry_delay,
        mlflow_conn_id=mlflow_conn_id,
    )
    run_uri = f"{{{{ ti.xcom_pull(task_ids='{train.task_id}')['run_uri'] }}}}"
    evaluate = EvaluateModelOperator(task_id="evaluate", run_uri=run_uri, conn_id=conn, mlflow_conn_id=mlflow_conn_id)
    promote = PromoteModelOperator(
        task_id="promote", name=model_name, store_uri=store, run_uri=run_uri, conn_id=conn,
        metric=gate["metric"], mode=gate["mode"], threshold=gate.get("threshold"),
        compare_to_production=gate.get("compare_to_production", True),
        allowed_verdicts=gate.get("allowed_verdicts", DEFAULT_ALLOWED_VERDICTS),
        fail_on_gate=gate.get("fail_on_gate", False),
        mlflow_conn_id=mlflow_conn_id, mlflow_alias=mlflow_alias,
    )
    if not require_approval:
        validate >> shard >> train >> evaluate >> promote
        return {"validate": validate, "shard": shard, "train": train, "evaluate": evaluate, "promote": promote}
    # A person answers between evaluate and promote, shown the gate promote applies (approval.py).
    approve = PromotionApprovalOperator(
        task_id="approve", name=model_name, store_uri=store, run_uri=run_uri, conn_id=conn,
        metric=gate["metric"], mode=gate["mode"], threshold=gate.get("threshold"),
        compare_to_production=gate.get("compare_to_production", True),
        allowed_verdicts=gate.get("allowed_verdicts", DEFAULT_ALLOWED_VERDICTS),
        response_timeout=approval_timeout, approvers=approvers,
    )
    validate >> shard >> train >> evaluate >> approve >> promote
    return {"validate": validate, "shard": shard, "train": train, "evaluate": evaluate, "approve": approve,
            "promote": promote}


def ringflow_pipeline(group_id: str, *, dataset_uri: Any, model_name: Any, store_uri: str | None = None,
                      num_workers: Any = 2, epochs: Any, batch_size: Any, learning_rate: Any,
                      suite: Sequence[Mapping] | Mapping | str | None = None,
                      gate: Mapping[str, Any] | None = None, job_config: Any = None, engine: Any = None,
                      conn_id: str | None = DEFAULT_CONN_ID,
                      backend: Any = None, tooltip: str | None = None, **options: Any) -> TaskGroup:
    """validate >> shard >> train >> evaluate >> promote as the TaskGroup `group_id`.

    dataset_uri: `builtin:<name>`, or a .csv/.parquet path, file:// or s3:// URI.
    store_uri: the base of shards/, runs/ and models/ (default: store_layout.default_store_uri(), i.e.
        $RINGFLOW_STORE or $AIRFLOW_HOME/ringflow-data). S3 goes through the Airflow connection `conn_id`
        (default `ringflow_s3`; None: no connection, the S3 variables of the environment; connections.py).
    suite: Great Expectations suite (list, dict, or JSON path relative to the DAG file); default: rows
        present and a non-null target.
    gate: {"metric", "mode" ("max"|"min"), "threshold", "compare_to_production", "allowed_verdicts",
        "fail_on_gate"}; metric, mode and threshold may be templates.
    job_config: overrides of the training config, applied last (a dict, or a template rendering to one).
    engine: "horovod" or "ddp" (PyTorch DDP under torchrun), or a template rendering to one; None: the
        config's default (horovod), or what job_config says.
    backend: where training runs (default: what the deployment configured: MPIJobs when
        $RINGFLOW_MPIJOB_SETTINGS is set, as the Helm values in deploy/ do, Kubeflow Trainer TrainJobs when
        $RINGFLOW_TRAINJOB_SETTINGS is; else local processes).
    options: target, seed, eval_fraction, controller, train_retries (default 1: a crashed job resumes from
        its last checkpoint), train_retry_delay, job_timeout,
        require_approval (default False: evaluate >> promote; True: evaluate >> approve >> promote, a person
        approves each promotion in the UI or through the REST API, see approval.py), approval_timeout (default
        24 hours; no answer by then rejects, nothing is promoted; None waits for ever), approvers (user ids
        allowed to answer; None: anyone who may edit the DAG's HITL details).
        Also: mlflow_conn_id (an MLflow server's Airflow connection, type http: every training run becomes an MLflow
        run, a promotion registers a model version and moves the alias; None, the default: no MLflow, not
        imported; operators/tracking.py), mlflow_alias (default "champion").
    """
    steps = "evaluate >> approve >> promote" if options.get("require_approval") else "evaluate >> promote"
    with TaskGroup(group_id=group_id, tooltip=tooltip or f"validate >> shard >> train >> {steps} ({group_id})") as group:
        pipeline_tasks(dataset_uri=dataset_uri, model_name=model_name, store_uri=store_uri,
                       num_workers=num_workers, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                       suite=suite, gate=gate, job_config=job_config, engine=engine, conn_id=conn_id,
                       backend=backend, **options)
    return group
