"""MLflow for the operators, optional: an Airflow connection -> TrackingSettings, and the one object the train,
evaluate, promote and rollback operators call (`MlflowTracking`). The work itself is Airflow-free
(ringflow.training.core.tracking); mlflow is imported only when a task with an MLflow connection logs.

The connection is an HTTP one, the usual way to name a server in Airflow:

    AIRFLOW_CONN_RINGFLOW_MLFLOW='{"conn_type": "http", "host": "mlflow.ml.svc", "port": 5000}'

host may carry the scheme ("https://mlflow.example.com"); otherwise `schema` is the scheme (default http).
login/password are the server's basic auth (MLFLOW_TRACKING_USERNAME/PASSWORD for the client).

Runs go to the experiment `experiment` (default: the DAG id), one MLflow run per run folder, named
`<run_id>/<task group>`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_run_folder, open_store_for
from ringflow.training.core.tracking.settings import DEFAULT_ALIAS, TrackingConfigError, TrackingSettings, check_alias

CONN_TYPE = "http"


def _how_to_define(conn_id: str) -> str:
    return (f"define it in Admin > Connections, or as the environment variable AIRFLOW_CONN_{conn_id.upper()}="
            f'\'{{"conn_type": "http", "host": "<mlflow host>", "port": 5000}}\' (login/password for basic auth)')


def tracking_settings_from_connection(conn_id: str, alias: str = DEFAULT_ALIAS) -> TrackingSettings:
    """The MLflow server of Airflow connection `conn_id` (type http: host, port, schema, login, password)."""
    from airflow.sdk import BaseHook  # here, not at import: only tasks that log need the lookup

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException, or the API server's own error in a worker
        raise TrackingConfigError(f"cannot read Airflow connection {conn_id!r} ({exc}): {_how_to_define(conn_id)}") from exc
    if conn.conn_type not in (CONN_TYPE, "https"):
        raise TrackingConfigError(f"Airflow connection {conn_id!r} has type {conn.conn_type!r}; make it type "
                                  f"{CONN_TYPE!r} with the MLflow server's host and port")
    host = (conn.host or "").strip().rstrip("/")
    if not host:
        raise TrackingConfigError(f"Airflow connection {conn_id!r} has no host: set it to the MLflow server's host")
    uri = host if "://" in host else f"{conn.schema or 'http'}://{host}"
    if conn.port:
        uri += f":{conn.port}"
    try:
        return TrackingSettings(uri=uri, username=conn.login or None, password=conn.password or None, alias=alias)
    except TrackingConfigError as exc:
        raise TrackingConfigError(f"Airflow connection {conn_id!r}: {exc}") from None


class MlflowTracking:
    """What an operator with `mlflow_conn_id` logs. The store connection (`conn_id`) reads the run folder."""

    def __init__(self, mlflow_conn_id: str, *, alias: str = DEFAULT_ALIAS, experiment: str | None = None,
                 conn_id: str | None = DEFAULT_S3_CONN_ID) -> None:
        self.mlflow_conn_id, self.alias, self.experiment, self.conn_id = mlflow_conn_id, alias, experiment, conn_id

    @classmethod
    def optional(cls, mlflow_conn_id: str | None, **kwargs: Any) -> "MlflowTracking | None":
        """None when no MLflow connection is given (or a template rendered to nothing)."""
        text = str(mlflow_conn_id).strip() if mlflow_conn_id is not None else ""
        if text in ("", "None"):
            return None
        if isinstance(kwargs.get("alias"), str):
            check_alias(kwargs["alias"])
        return cls(text, **kwargs)

    def settings(self) -> TrackingSettings:
        return tracking_settings_from_connection(self.mlflow_conn_id, self.alias)

    def experiment_for(self, context: Any) -> str:
        return self.experiment or context["ti"].dag_id

    def _open(self, uri: str):
        return open_store_for(uri, self.conn_id)

    def _open_run(self, uri: str):
        return open_run_folder(uri, self.conn_id)

    def log_training(self, context: Any, *, run_uri: str, job_config: Mapping[str, Any] | None,
                     result: Any, group_id: str | None, run_folder: Any = None,
                     health_records: Sequence[Mapping[str, Any]] | None = None) -> str:
        """run_folder, health_records: the RunFolder at run_uri and its records, when the caller has them."""
        from ringflow.training.core.tracking.mlflow_runs import log_training_run

        ti = context["ti"]
        tags = {"ringflow.dag_id": ti.dag_id, "ringflow.run_id": ti.run_id, "ringflow.task_id": ti.task_id}
        return log_training_run(self.settings(), experiment=self.experiment_for(context), run_uri=run_uri,
                                run_folder=run_folder if run_folder is not None else self._open_run(run_uri),
                                job_config=job_config, result=result,
                                run_name=f"{ti.run_id}/{group_id or ti.task_id}", tags=tags,
                                health_records=health_records)

    def log_evaluation(self, context: Any, *, run_uri: str, eval_doc: Mapping[str, Any]) -> str:
        from ringflow.training.core.tracking.mlflow_runs import log_evaluation

        return log_evaluation(self.settings(), experiment=self.experiment_for(context), run_uri=run_uri,
                              run_folder=self._open_run(run_uri), eval_doc=eval_doc)

    def register(self, context: Any, *, run_uri: str, checkpoint: str, model_name: str, store_version: int,
                 metrics: Mapping[str, Any], run_folder: Any) -> int:
        """run_folder: the RunFolder at run_uri (the promoter holds the store it lies in: promote.run_folder_in)."""
        from ringflow.training.core.tracking.mlflow_registry import register_promotion

        return register_promotion(self.settings(), experiment=self.experiment_for(context), run_uri=run_uri,
                                  run_folder=run_folder, checkpoint=checkpoint, model_name=model_name,
                                  store_version=store_version, open_store=self._open, metrics=metrics)

    def rolled_back(self, *, model_name: str, store_version: int) -> int | None:
        from ringflow.training.core.tracking.mlflow_registry import point_alias

        return point_alias(self.settings(), model_name=model_name, store_version=store_version)
