"""Score a training run's final checkpoint on the held-out split (ringflow.training.core.evaluate).

The metrics land in `eval.json` in the run folder (training/core/evaluate.py writes it through the RunFolder; `ringflow evaluate`
runs the same step), where the
promote task reads them. Torch is imported only when the task runs: DAG files importing this module stay
light. An s3:// run folder, and the shards its checkpoint names, are read with the S3 settings of the task's
connection (connections.open_run_folder): nothing is put in the process environment.
"""
from __future__ import annotations

from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_run_folder
from ringflow.operators.tracking import MlflowTracking



class RunNotEvaluable(AirflowException):
    """The run has no final checkpoint to score (core's RunNotReady): not trained, or it failed."""


def evaluate(run_uri: str, checkpoint: str | None = None,
             conn_id: str | None = DEFAULT_S3_CONN_ID) -> dict[str, Any]:
    """training/core/evaluate.py's evaluate_run on the run folder opened with `conn_id`; returns eval.json's
    document plus where it is."""
    from ringflow.training.core.evaluate import evaluate_run  # imports torch
    from ringflow.training.core.run_reader import RunNotReady

    run = open_run_folder(run_uri, conn_id)
    try:
        result = evaluate_run(run, checkpoint)
    except RunNotReady as exc:
        raise RunNotEvaluable(str(exc)) from exc
    return {**result.to_dict(), "run_uri": run_uri, "eval_uri": run.eval_uri}


class EvaluateModelOperator(BaseOperator):
    """Metrics of the run's final checkpoint (the one result.json names, or `checkpoint`) on the eval split.

    Returns (XCom) `{"metrics": {"accuracy": ..., "loss": ...} or {"mse", "mae", "r2", "loss"}, "checkpoint",
    "step", "rows", "task", "evaluated_at", "run_uri", "eval_uri"}`.

    mlflow_conn_id: an MLflow server's Airflow connection (operators/tracking.py): the metrics (eval/<name> at
    the checkpoint's step) and eval.json go to the run folder's MLflow run; None: no MLflow.
    """

    template_fields: Sequence[str] = ("run_uri", "checkpoint", "conn_id")
    ui_color = "#e6f4ea"

    def __init__(self, *, run_uri: str, checkpoint: str | None = None, conn_id: str | None = DEFAULT_S3_CONN_ID,
                 mlflow_conn_id: str | None = None, mlflow_experiment: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_uri, self.checkpoint, self.conn_id = run_uri, checkpoint, conn_id
        self.mlflow_conn_id, self.mlflow_experiment = mlflow_conn_id, mlflow_experiment

    def execute(self, context: Any) -> dict[str, Any]:
        result = evaluate(self.run_uri, self.checkpoint or None, self.conn_id)
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in result["metrics"].items())
        self.log.info("checkpoint %s (step %s) on %d held-out rows: %s; written to %s",
                      result["checkpoint"], result["step"], result["rows"], metrics, result["eval_uri"])
        tracking = MlflowTracking.optional(self.mlflow_conn_id, experiment=self.mlflow_experiment,
                                           conn_id=self.conn_id)
        if tracking is not None:
            result["mlflow_run_id"] = tracking.log_evaluation(context, run_uri=self.run_uri, eval_doc=result)
        return result
