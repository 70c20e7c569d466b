"""MLflow tracking and registry through the operators, against a real `mlflow server` (SQLite backend, artifacts
in an S3 bucket of the test S3 server, as a team would put them in its MinIO bucket) on 127.0.0.1: real
2-worker training runs, then evaluate, promote and roll back, checked through MlflowClient. Nothing mocked.

The server (the `mlflow_server` fixture, tests/conftest.py) runs from its own venv (scripts/setup.sh:
$VENV/mlflow-server, or $RINGFLOW_MLFLOW_VENV)."""
from __future__ import annotations

import asyncio
import json
import pathlib
import types

import pytest
from airflow.sdk.exceptions import TaskDeferred

from mlflow_test_server import free_port

from ringflow.operators.evaluate import EvaluateModelOperator
from ringflow.operators.promote import PromoteModelOperator, RollbackModelOperator
from ringflow.operators.tracking import MlflowTracking, tracking_settings_from_connection
from ringflow.operators.train import TrainOperator
from ringflow.training.core.backends.local import LocalProcessBackend
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.core.tracking.settings import TrackingConfigError

CONN_ID = "ringflow_mlflow"
DAG_ID = "ringflow_tracking_test"


@pytest.fixture
def mlflow_connection(mlflow_server, monkeypatch):
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}",
                       json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": mlflow_server.port}))
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    return CONN_ID


def context(run_id: str, task_id: str, map_index: int = -1):
    return {"ti": types.SimpleNamespace(dag_id=DAG_ID, run_id=run_id, task_id=task_id, try_number=1,
                                        map_index=map_index)}


def train(tmp_path, store, manifest, run_id: str, map_index: int = -1, **kwargs) -> dict:
    """The train task as Airflow runs it: execute, the trigger's one event, execute_complete."""
    op = TrainOperator(task_id="train", manifest_uri=manifest, store_uri=str(store), conn_id=None,
                       backend=LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2),
                       mlflow_conn_id=CONN_ID, **kwargs)
    ctx = context(run_id, "train", map_index)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)

    async def first_event():
        async for event in deferred.value.trigger.run():
            return event.payload

    event = json.loads(json.dumps(asyncio.run(first_event())))  # as the triggerer stores it
    return op.execute_complete(ctx, event)


def eval_rows(manifest_path: str):
    """The held-out split: the feature columns as a DataFrame (what a caller sends) and the labels."""
    from ringflow.training.formats.manifest import load_manifest
    from ringflow.training.core.sharding import read_partition

    manifest, store = load_manifest(manifest_path)
    frame = read_partition(store, manifest.eval).to_pandas()
    return frame[list(manifest.schema.features)], frame[manifest.schema.target].to_numpy()


def champion_accuracy(uri: str, name: str, features, labels) -> float:
    import mlflow

    model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    predictions = model.predict(features)
    assert predictions.shape == labels.shape
    return float((predictions == labels).mean())


SWEEP_RUN_ID, SWEEP_GROUP = "manual__sweep", "sweep"
# Two candidates of a sweep, the second with the larger learning rate: trained and evaluated once for this
# module (each is a real 2-worker job), then promoted, replaced and rolled back by one test and selected from
# by another.
CANDIDATES = [{"learning_rate": 0.0005}, {"learning_rate": 0.004}]


@pytest.fixture(scope="module")
def candidates(tmp_path_factory, digits_manifest, mlflow_server):
    """(store, [train task outcome], [evaluate task outcome]) of the two CANDIDATES, as the sweep's mapped
    train and evaluate tasks run them, each tracked in MLflow."""
    from ringflow.training.core.runs import store_layout

    tmp_path = tmp_path_factory.mktemp("tracked")
    store = tmp_path / "store"
    trained, evaluated = [], []
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}",
                           json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": mlflow_server.port}))
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            monkeypatch.delenv(name, raising=False)
        for index, overrides in enumerate(CANDIDATES):
            run_uri = store_layout.run_uri(str(store), DAG_ID, SWEEP_RUN_ID, SWEEP_GROUP, map_index=index)
            trained.append(train(tmp_path, store, digits_manifest, SWEEP_RUN_ID, map_index=index, run_uri=run_uri,
                                 epochs=1, **overrides))
            evaluated.append(EvaluateModelOperator(task_id=f"{SWEEP_GROUP}.evaluate", run_uri=run_uri, conn_id=None,
                                                   mlflow_conn_id=CONN_ID).execute(
                context(SWEEP_RUN_ID, f"{SWEEP_GROUP}.evaluate", index)))
    return store, trained, evaluated


@pytest.mark.job
@pytest.mark.timeout(600)
def test_runs_are_tracked_and_promotions_registered_and_rolled_back(tmp_path, digits_manifest, mlflow_server,
                                                                    mlflow_connection, candidates, monkeypatch):
    from mlflow import MlflowClient

    from run_folder_files import read_health
    from ringflow.training.store import open_store

    store, trained, evaluated = candidates
    name = "digits-tracked"
    client = MlflowClient(mlflow_server.uri)

    # -- run A (the larger learning rate): trained, evaluated, promoted as version 1 -> champion
    out, ev = trained[1], evaluated[1]
    run_a = out["run_uri"]
    assert out["status"] == "succeeded" and out["mlflow_run_id"]
    assert ev["mlflow_run_id"] == out["mlflow_run_id"]  # the same MLflow run: found by the run folder
    promoted = PromoteModelOperator(task_id="promote", name=name, store_uri=str(store), run_uri=run_a, conn_id=None,
                                    mlflow_conn_id=CONN_ID).execute(context("manual__a", "promote"))
    assert promoted["promoted"] and promoted["version"] == 1 and promoted["mlflow_version"] == 1

    run = client.get_run(out["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == f"{SWEEP_RUN_ID}/train"
    assert client.get_experiment(run.info.experiment_id).name == DAG_ID
    # the job's parameters: the checked JobConfig, flattened
    assert run.data.params["epochs"] == "1" and run.data.params["learning_rate"] == "0.004"
    assert run.data.params["health.every_steps"] == "10" and run.data.params["model.hidden"] == "[64, 64]"
    assert run.data.params["run_uri"] == run_a
    # the verdict as a tag
    result_file = pathlib.Path(run_a) / RunFolder(open_store(run_a)).result_key()  # the published one
    result = json.loads(result_file.read_text())
    assert run.data.tags["ringflow.verdict"] == result["verdict"]["status"] in ("HEALTHY", "DEGRADED")
    assert run.data.tags["ringflow.run_uri"] == run_a and run.data.tags["ringflow.dag_id"] == DAG_ID
    # per-step loss and health measurements, each at its step
    steps = [r for r in read_health(open_store(run_a)) if r["type"] == "step"]
    assert len(steps) >= 2
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in loss] == [(r["step"], r["loss"]) for r in steps]
    for key in ("health/grad_norm", "health/sync_share", "health/step_time_s", "health/samples_per_sec"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [r["step"] for r in steps], key
    (acc,) = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert (acc.step, acc.value) == (ev["step"], ev["metrics"]["accuracy"])
    # artifacts, in the server's S3 bucket
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"result.json", "health.png", "eval.json"}
    got = client.download_artifacts(run.info.run_id, "result.json", str(tmp_path))
    assert pathlib.Path(got).read_bytes() == result_file.read_bytes()
    keys = [o["Key"] for o in mlflow_server.s3.boto3_client().list_objects_v2(Bucket=mlflow_server.bucket)["Contents"]]
    assert any(k.endswith(f"{run.info.run_id}/artifacts/result.json") for k in keys), keys

    # the registered model: version 1 mirrors ringflow version 1, is @champion, and predicts as evaluate scores
    v1 = client.get_model_version_by_alias(name, "champion")
    assert v1.version == "1" and v1.tags["ringflow.version"] == "1" and v1.run_id == run.info.run_id
    assert not v1.current_stage or v1.current_stage == "None"  # aliases, not the deprecated stages
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    features, labels = eval_rows(digits_manifest)
    accuracy_a = ev["metrics"]["accuracy"]
    assert champion_accuracy(mlflow_server.uri, name, features, labels) == pytest.approx(accuracy_a, abs=1e-12)

    # -- run B (another training, a smaller learning rate): promoted over A as version 2, the alias follows
    out_b, ev_b = trained[0], evaluated[0]
    assert ev_b["metrics"]["accuracy"] != accuracy_a  # two different models, or the rollback proves nothing
    promoted_b = PromoteModelOperator(task_id="promote", name=name, store_uri=str(store), run_uri=out_b["run_uri"],
                                      conn_id=None, compare_to_production=False, mlflow_conn_id=CONN_ID,
                                      ).execute(context("manual__b", "promote"))
    assert (promoted_b["version"], promoted_b["mlflow_version"]) == (2, 2)
    assert client.get_model_version_by_alias(name, "champion").version == "2"
    assert champion_accuracy(mlflow_server.uri, name, features, labels) == pytest.approx(ev_b["metrics"]["accuracy"],
                                                                                        abs=1e-12)
    # a retried promote task finds its MLflow version instead of registering another
    again = MlflowTracking(CONN_ID, conn_id=None).register(
        context("manual__b", "promote"), run_uri=out_b["run_uri"], checkpoint=out_b["checkpoint"],
        model_name=name, store_version=2, metrics=ev_b["metrics"], run_folder=RunFolder.open(out_b["run_uri"]))
    assert again == 2 and len(client.search_model_versions(f"name='{name}'")) == 2

    # -- rollback: production back to version 1, and @champion with it
    back = RollbackModelOperator(task_id="rollback", name=name, store_uri=str(store), conn_id=None,
                                 mlflow_conn_id=CONN_ID).execute(context("manual__c", "rollback"))
    assert (back["version"], back["mlflow_version"]) == (1, 1)
    assert client.get_model_version_by_alias(name, "champion").version == "1"
    assert champion_accuracy(mlflow_server.uri, name, features, labels) == pytest.approx(accuracy_a, abs=1e-12)


@pytest.mark.job
@pytest.mark.timeout(600)
def test_a_sweeps_winner_is_registered_from_its_own_mlflow_run(tmp_path, digits_manifest, mlflow_server,
                                                                 mlflow_connection, candidates, monkeypatch):
    """The sweep's select task registers the winning candidate, not another one: the model version points at
    the winner's MLflow run and serves the winner's model."""
    from mlflow import MlflowClient

    from ringflow.operators.sweep import SelectAndPromoteOperator

    store, trained, evaluated = candidates
    name, run_id, group, configurations = "digits-swept", SWEEP_RUN_ID, SWEEP_GROUP, CANDIDATES
    accuracies = [ev["metrics"]["accuracy"] for ev in evaluated]
    assert accuracies[0] != accuracies[1]  # two different models, or the winner's identity proves nothing
    best = accuracies.index(max(accuracies))

    out = SelectAndPromoteOperator(task_id=f"{group}.select", name=name, store_uri=str(store),
                                   configurations=configurations, group_id=group, conn_id=None,
                                   mlflow_conn_id=CONN_ID).execute(context(run_id, f"{group}.select"))
    assert out["promoted"] and out["winner"] == best and (out["version"], out["mlflow_version"]) == (1, 1)

    client = MlflowClient(mlflow_server.uri)
    champion = client.get_model_version_by_alias(name, "champion")
    assert champion.version == "1" and champion.tags["ringflow.version"] == "1"
    assert champion.run_id == trained[best]["mlflow_run_id"] != trained[1 - best]["mlflow_run_id"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    features, labels = eval_rows(digits_manifest)
    assert champion_accuracy(mlflow_server.uri, name, features, labels) == pytest.approx(accuracies[best], abs=1e-12)


@pytest.mark.job
@pytest.mark.timeout(300)
def test_a_failed_run_is_an_mlflow_run_too(tmp_path, digits_manifest, mlflow_server, mlflow_connection):
    from airflow.sdk.exceptions import AirflowFailException
    from mlflow import MlflowClient

    with pytest.raises(AirflowFailException, match="NONFINITE"):
        train(tmp_path, tmp_path / "store", digits_manifest, "manual__nan", epochs=1,
              job_config={"faults": [{"kind": "nan_gradient", "rank": 1, "step": 5}]})
    client = MlflowClient(mlflow_server.uri)
    (run,) = client.search_runs([client.get_experiment_by_name(DAG_ID).experiment_id],
                                filter_string="tags.`ringflow.run_id` = 'manual__nan'")
    assert run.info.status == "FAILED"
    assert run.data.tags["ringflow.verdict"] == "NONFINITE" and run.data.tags["ringflow.status"] == "failed"
    assert run.data.params["faults"].startswith("[")


def test_the_connection_gives_the_server_and_its_login(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MLF", json.dumps({"conn_type": "http", "host": "mlflow.ml.svc", "port": 5000,
                                                        "login": "team", "password": "s3cret"}))
    settings = tracking_settings_from_connection("mlf", alias="prod")
    assert (settings.uri, settings.alias) == ("http://mlflow.ml.svc:5000", "prod")
    assert settings.env() == {"MLFLOW_TRACKING_URI": "http://mlflow.ml.svc:5000",
                              "MLFLOW_TRACKING_USERNAME": "team", "MLFLOW_TRACKING_PASSWORD": "s3cret"}
    assert "s3cret" not in repr(settings)
    monkeypatch.setenv("AIRFLOW_CONN_MLF", json.dumps({"conn_type": "http", "host": "https://mlflow.example.com",
                                                        "schema": "ignored-when-host-has-one"}))
    assert tracking_settings_from_connection("mlf").uri == "https://mlflow.example.com"


@pytest.mark.parametrize("conn, says", [
    ({"conn_type": "aws", "host": "x"}, "has type 'aws'; make it type 'http'"),
    ({"conn_type": "http"}, "has no host"),
    ({"conn_type": "http", "host": "h", "login": "only-a-user"}, "both username and password"),
])
def test_connection_errors_say_what_to_fix(monkeypatch, conn, says):
    monkeypatch.setenv("AIRFLOW_CONN_MLF", json.dumps(conn))
    with pytest.raises(TrackingConfigError, match=says):
        tracking_settings_from_connection("mlf")


def test_a_missing_connection_says_how_to_define_it():
    with pytest.raises(TrackingConfigError, match="AIRFLOW_CONN_NO_SUCH_MLFLOW="):
        tracking_settings_from_connection("no_such_mlflow")


def test_no_connection_means_no_tracking_and_a_bad_alias_fails_at_parse_time():
    assert MlflowTracking.optional(None) is None and MlflowTracking.optional("None") is None
    with pytest.raises(TrackingConfigError, match="'latest'"):
        PromoteModelOperator(task_id="p", name="m", store_uri="/tmp/s", run_uri="/tmp/s/r",
                             mlflow_conn_id=CONN_ID, mlflow_alias="latest")


def test_the_pipeline_factory_hands_the_connection_and_alias_to_the_tasks_that_log():
    from airflow.sdk import DAG

    from ringflow.operators.pipeline import pipeline_tasks
    from ringflow.operators.pipeline_specs import DataSpec, TrackingSpec, TrainingSpec

    training = TrainingSpec(epochs=1, batch_size=32, learning_rate=0.01)
    with DAG("tracked", schedule=None):
        tasks = pipeline_tasks(data=DataSpec("builtin:digits"), training=training, model_name="m", store_uri="/tmp/s",
                               tracking=TrackingSpec(mlflow_conn_id=CONN_ID, alias="challenger"))
    assert tasks["train"].mlflow_conn_id == tasks["evaluate"].mlflow_conn_id == tasks["promote"].mlflow_conn_id == CONN_ID
    assert tasks["promote"].mlflow_alias == "challenger"
    with DAG("untracked", schedule=None):
        plain = pipeline_tasks(data=DataSpec("builtin:digits"), training=training, model_name="m", store_uri="/tmp/s")
    assert plain["train"].mlflow_conn_id is plain["evaluate"].mlflow_conn_id is plain["promote"].mlflow_conn_id is None


def test_an_unreachable_server_fails_a_succeeded_train_task_but_never_hides_a_training_failure(
        tmp_path, digits_manifest, monkeypatch):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from ringflow.training.health.verdict import Verdict
    from ringflow.training.formats.run_result import RunResult

    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}",
                       json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": free_port()}))  # nobody there
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"),
                       conn_id=None, mlflow_conn_id=CONN_ID)
    result = RunResult(status="succeeded", attempt="rf-1", step=44, epoch=2, world_size=2, checkpoint="ckpt-000000044",
                       verdict=Verdict("HEALTHY", "no sign of trouble", {}))
    from ringflow.operators.trigger import TrainJobTrigger
    from ringflow.training.core.failure_policy import Observation

    succeeded = TrainJobTrigger.event("rf-1", Observation("succeeded", 0, result=result, attempt="rf-1"))
    with pytest.raises(AirflowException, match=f"could not log run .* to MLflow \\(connection '{CONN_ID}'\\)") as err:
        op.execute_complete(context("manual__x", "train"), succeeded)
    assert "Connection refused" in str(err.value) or "Max retries" in str(err.value), err.value
    nan = TrainJobTrigger.event("rf-1", Observation("failed", 1, "the job failed", attempt="rf-1",
                                                    verdict=Verdict("NONFINITE", "NaN", {"step": 4}), fatal=True))
    with pytest.raises(AirflowFailException, match="NONFINITE"):  # the training's own error, not MLflow's
        op.execute_complete(context("manual__x", "train"), nan)


def test_the_sweep_factory_hands_the_connection_and_alias_to_every_candidate_and_the_selection():
    from airflow.sdk import DAG

    from ringflow.operators.pipeline_specs import DataSpec, TrackingSpec, TrainingSpec
    from ringflow.operators.sweep import ringflow_sweep

    with DAG("tracked_sweep", schedule=None) as dag:
        ringflow_sweep("sweep", model_name="m", configurations=[{"seed": 1}], store_uri="/tmp/s",
                       data=DataSpec("builtin:digits"), training=TrainingSpec(epochs=1, batch_size=32, learning_rate=0.01),
                       tracking=TrackingSpec(mlflow_conn_id=CONN_ID, alias="challenger"))
    tasks = {task_id.rsplit(".", 1)[-1]: task for task_id, task in dag.task_dict.items()}
    assert tasks["train"].mlflow_conn_id == tasks["evaluate"].mlflow_conn_id == CONN_ID
    assert tasks["select_and_promote"].mlflow_conn_id == CONN_ID
    assert tasks["select_and_promote"].mlflow_alias == "challenger"
