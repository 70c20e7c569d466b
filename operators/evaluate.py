"""Score a training run's final checkpoint on the held-out split (ringflow.training.evaluate).

The metrics land in `eval.json` in the run folder (evaluate_run writes it), where the promote task reads
them. Torch is imported only when the task runs: DAG files importing this module stay light.

For an s3:// run the training code reads its S3 settings from the environment (RINGFLOW_S3_ENDPOINT,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); the operator takes them from the Airflow connection and sets
them only for the duration of the call.
"""
from __future__ import annotations

import contextlib
import urllib.parse
from typing import Any, Iterator, Sequence

from airflow.sdk import BaseOperator

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, s3_settings_from_connection
from ringflow.operators.tracking import MlflowTracking
from ringflow.training.runs import store_layout
from ringflow.training.scoped_environ import scoped_environ


@contextlib.contextmanager
def s3_env_for(uri: str, conn_id: str | None) -> Iterator[None]:
    """Within the block, the process environment carries the S3 settings of `conn_id` if `uri` is on S3;
    the previous values come back afterwards, so no credential outlives the call. conn_id None: no
    connection, the environment's own S3 settings stay (connections.py)."""
    if urllib.parse.urlsplit(uri).scheme != "s3" or conn_id is None:
        yield
        return
    with scoped_environ(s3_settings_from_connection(conn_id).to_env()):
        yield


def evaluate(run_uri: str, checkpoint: str | None = None,
             conn_id: str | None = DEFAULT_S3_CONN_ID) -> dict[str, Any]:
    """evaluate_run with the S3 settings of `conn_id`; returns eval.json's document plus where it is."""
    from ringflow.training.evaluate import evaluate_run  # imports torch
    from ringflow.training.run_layout import EVAL

    with s3_env_for(run_uri, conn_id):
        doc = evaluate_run(run_uri, checkpoint)
    return {**doc, "run_uri": run_uri, "eval_uri": store_layout.join(run_uri, EVAL)}


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
