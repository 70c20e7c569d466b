"""Score a training run's final checkpoint on the held-out split (ringflow.training.evaluate).

The metrics land in `eval.json` in the run folder (training/evaluate.py writes it, `ringflow evaluate` runs the
same step), where the promote task reads them. Torch is imported only when the task runs: DAG files
importing this module stay light.

For an s3:// run the training code reads its S3 settings from the environment (RINGFLOW_S3_ENDPOINT,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); the operator takes them from the Airflow connection and sets
them only for the duration of the call.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ringflow.operators.connections import DEFAULT_CONN_ID, s3_settings_from_connection
from ringflow.operators.tracking import MlflowTracking


class RunNotEvaluable(AirflowException):
    """The run has no final checkpoint to score (core's RunNotReady): not trained, or it failed."""


def connection_settings(conn_id: str | None):
    """The S3 settings of `conn_id`, asked only when needed; None: no connection, the environment's stay."""
    return None if conn_id is None else (lambda: s3_settings_from_connection(conn_id))


@contextlib.contextmanager
def s3_env_for(uri: str, conn_id: str | None) -> Iterator[None]:
    """Within the block, the process environment carries the S3 settings of `conn_id` if `uri` is on S3
    (training/evaluate.py's s3_env_for, with the Airflow connection's settings)."""
    from ringflow.training.evaluate import s3_env_for as scoped  # imports torch

    with scoped(uri, connection_settings(conn_id)):
        yield


class EvaluateModelOperator(BaseOperator):
    """Metrics of the run's final checkpoint (the one result.json names, or `checkpoint`) on the eval split.

    Returns (XCom) `{"metrics": {"accuracy": ..., "loss": ...} or {"mse", "mae", "r2", "loss"}, "checkpoint",
    "step", "rows", "task", "evaluated_at", "run_uri", "eval_uri"}`.

    mlflow_conn_id: an MLflow server's Airflow connection (operators/tracking.py): the metrics (eval/<name> at
    the checkpoint's step) and eval.json go to the run folder's MLflow run; None: no MLflow.
    """

    template_fields: Sequence[str] = ("run_uri", "checkpoint", "conn_id")
    ui_color = "#e6f4ea"

    def __init__(self, *, run_uri: str, checkpoint: str | None = None, conn_id: str | None = DEFAULT_CONN_ID,
                 mlflow_conn_id: str | None = None, mlflow_experiment: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_uri, self.checkpoint, self.conn_id = run_uri, checkpoint, conn_id
        self.mlflow_conn_id, self.mlflow_experiment = mlflow_conn_id, mlflow_experiment

    def execute(self, context: Any) -> dict[str, Any]:
        from ringflow.training.core.run_reader import RunNotReady
        from ringflow.training.evaluate import evaluate  # imports torch

        try:
            result = evaluate(self.run_uri, self.checkpoint or None, connection_settings(self.conn_id))
        except RunNotReady as exc:
            raise RunNotEvaluable(str(exc)) from exc
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in result["metrics"].items())
        self.log.info("checkpoint %s (step %s) on %d held-out rows: %s; written to %s",
                      result["checkpoint"], result["step"], result["rows"], metrics, result["eval_uri"])
        tracking = MlflowTracking.optional(self.mlflow_conn_id, experiment=self.mlflow_experiment,
                                           conn_id=self.conn_id)
        if tracking is not None:
            result["mlflow_run_id"] = tracking.log_evaluation(context, run_uri=self.run_uri, eval_doc=result)
        return result
