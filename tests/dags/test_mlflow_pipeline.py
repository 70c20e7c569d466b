"""A whole pipeline DAG with `mlflow_conn_id`, run by `dag.test()` against a real `mlflow server`: the training
run is an MLflow run (params, per-step metrics, the verdict tag, the artifacts) and the promotion a registered
model version under the `champion` alias that `models:/<name>@champion` loads. The connection is an Airflow
connection (an AIRFLOW_CONN_ variable), the usual way."""
from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(420)]

CONN_ID = "ringflow_mlflow"


DAG_ID, MODEL = "ringflow_tracked_dag", "digits-dag-tracked"
# The DAG a team writes (docs/guides/mlflow.md); dag.test() finds a DAG in its folder.
DAG_FILE = f"""
from airflow.sdk import DAG

from ringflow.operators.pipeline import ringflow_pipeline
from ringflow.operators.pipeline_specs import DataSpec, TrackingSpec, TrainingSpec

with DAG({DAG_ID!r}, schedule=None):
    ringflow_pipeline("digits", data=DataSpec("builtin:digits"), model_name={MODEL!r}, conn_id=None,
                      training=TrainingSpec(epochs=1, batch_size=32, learning_rate=0.004, num_workers=2),
                      tracking=TrackingSpec(mlflow_conn_id={CONN_ID!r}))
"""


def test_a_pipeline_with_an_mlflow_connection_tracks_its_run_and_registers_its_promotion(
        airflow_db, store, mlflow_server, monkeypatch, tmp_path):
    import mlflow
    from airflow.dag_processing.dagbag import DagBag
    from mlflow import MlflowClient

    from ringflow.training.core.runs import store_layout

    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}",
                       json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": mlflow_server.port}))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "tracked.py").write_text(DAG_FILE)
    # The DAG bundle dag.test() walks: this folder (the dags folder itself is fixed when Airflow is imported).
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([
        {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(folder)}}]))
    bag = DagBag(str(folder))
    assert not bag.import_errors, bag.import_errors
    dag_id, name = DAG_ID, MODEL
    dr = bag.dags[dag_id].test()
    states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    assert dr.state == "success", states

    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name(dag_id)
    assert experiment is not None, "the experiment is named after the DAG"
    [run] = client.search_runs([experiment.experiment_id])
    run_uri = store_layout.run_uri(str(store), dag_id, dr.run_id, "digits")
    assert run.info.status == "FINISHED"
    assert run.data.tags["ringflow.verdict"] in ("HEALTHY", "DEGRADED")
    assert run.data.params["epochs"] == "1" and run.data.params["engine"] == "horovod"
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert len(losses) > 1 and [m.step for m in losses] == sorted(m.step for m in losses)
    assert "eval/accuracy" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"result.json", "health.png", "eval.json"} <= artifacts

    pointer = json.loads((store / "models" / name / "production.json").read_text())
    assert pointer["run_uri"] == run_uri
    champion = client.get_model_version_by_alias(name, "champion")
    assert champion.run_id == run.info.run_id
    assert champion.tags["ringflow.version"] == str(pointer["version"])
    mlflow.set_tracking_uri(mlflow_server.uri)
    assert mlflow.pyfunc.load_model(f"models:/{name}@champion").get_raw_model() is not None
