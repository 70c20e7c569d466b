"""The DAG files, without running them: they import cleanly, their Params refuse bad values, the pipeline
TaskGroup composes more than once, and the wiring templates render to what the tasks need."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

PIPELINE = ["validate", "shard", "train", "evaluate", "promote"]


def test_dags_import_without_errors(dagbag):
    assert set(dagbag.dag_ids) == {"ringflow_retrain", "ringflow_retrain_on_asset", "ringflow_two_models"}
    for dag_id in ("ringflow_retrain", "ringflow_retrain_on_asset"):
        dag = dagbag.dags[dag_id]
        assert sorted(dag.task_ids) == sorted(f"digits.{step}" for step in PIPELINE)
        assert dag.catchup is False
    assert dagbag.dags["ringflow_retrain"].schedule == "0 3 * * 1"


def test_asset_variant_is_scheduled_on_the_dataset_asset(dagbag, store):
    from airflow.sdk import Asset

    dag = dagbag.dags["ringflow_retrain_on_asset"]
    asset, = dag.schedule
    assert isinstance(asset, Asset) and asset.name == "ringflow-dataset-digits"
    assert asset.uri == f"file://{store}/datasets/digits.parquet"
    assert dag.params["dataset_uri"] == asset.uri  # an asset-triggered run reads the file the event is about


def test_each_pipeline_is_a_chain(dagbag):
    dag = dagbag.dags["ringflow_retrain"]
    for upstream, downstream in zip(PIPELINE, PIPELINE[1:]):
        assert dag.get_task(f"digits.{upstream}").downstream_task_ids == {f"digits.{downstream}"}
    assert dag.get_task("digits.validate").upstream_task_ids == set()


def test_dag_files_import_neither_torch_nor_great_expectations(dags_env):
    """The scheduler parses DAG files over and over: heavy libraries load only when a task runs."""
    import os

    code = ("import sys; from airflow.dag_processing.dagbag import DagBag; "
            f"bag = DagBag({dags_env['AIRFLOW__CORE__DAGS_FOLDER']!r}); assert not bag.import_errors, bag.import_errors; "
            "heavy = sorted(m for m in ('torch', 'horovod', 'great_expectations', 'matplotlib') if m in sys.modules); "
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **dags_env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout


def test_params_have_defaults_the_form_shows(dagbag):
    params = dagbag.dags["ringflow_retrain"].params
    assert {k: params[k] for k in ("dataset_uri", "model_name", "num_workers", "epochs", "batch_size",
                                   "learning_rate", "gate_metric", "gate_mode", "job_overrides")} == {
        "dataset_uri": "builtin:digits", "model_name": "digits-mlp", "num_workers": 2, "epochs": 5,
        "batch_size": 32, "learning_rate": 0.002, "gate_metric": "accuracy", "gate_mode": "max",
        "job_overrides": {}}
    schema = params.get_param("num_workers").schema
    assert (schema["type"], schema["minimum"], schema["maximum"]) == ("integer", 1, 16)


@pytest.mark.parametrize("conf", [
    {"num_workers": 0}, {"num_workers": 17}, {"num_workers": 1.5}, {"epochs": 0}, {"epochs": 1001},
    {"batch_size": 0}, {"batch_size": 5000}, {"learning_rate": 0}, {"learning_rate": -0.1},
    {"gate_mode": "median"}, {"gate_metric": "f1"}, {"model_name": "no spaces/allowed"},
    {"job_overrides": "not an object"}, {"dataset_uri": ""},
])
def test_params_refuse_bad_values(dagbag, conf):
    from airflow.sdk.definitions.param import ParamValidationError

    import copy

    params = copy.deepcopy(dagbag.dags["ringflow_retrain"].params)
    with pytest.raises(ParamValidationError):
        params.update(conf)
        params.validate()


def test_params_accept_good_values(dagbag):
    import copy

    params = copy.deepcopy(dagbag.dags["ringflow_retrain"].params)
    params.update({"num_workers": 16, "epochs": 1, "batch_size": 4096, "learning_rate": 0.5, "gate_mode": "min",
                   "gate_metric": "loss", "gate_threshold": 0.3,
                   "job_overrides": {"faults": [{"kind": "crash", "rank": 1, "step": 3}]}})
    assert params.validate()["num_workers"] == 16


def test_pipeline_composes_twice_in_one_dag(dagbag, store):
    dag = dagbag.dags["ringflow_two_models"]
    assert sorted(dag.task_ids) == sorted(f"{g}.{s}" for g in ("digits", "diabetes") for s in PIPELINE)
    for group in ("digits", "diabetes"):  # two separate chains, nothing crosses between them
        for upstream, downstream in zip(PIPELINE, PIPELINE[1:]):
            assert dag.get_task(f"{group}.{upstream}").downstream_task_ids == {f"{group}.{downstream}"}
    digits, diabetes = dag.get_task("digits.train"), dag.get_task("diabetes.train")
    assert digits.run_uri != diabetes.run_uri and digits.run_uri.endswith("/digits")
    assert "digits.shard" in digits.manifest_uri and "diabetes.shard" in diabetes.manifest_uri
    assert dag.get_task("diabetes.promote").gate.mode == "min"
    assert dag.get_task("diabetes.promote").gate.metric == "mse"


def test_factory_in_a_new_dag_with_plain_values(tmp_path):
    """Without Params: plain values, a suite given inline, the default store, two groups."""
    import datetime as dt

    from airflow.sdk import DAG

    from ringflow.operators.pipeline import ringflow_pipeline

    with DAG("factory_twice", schedule=None, start_date=dt.datetime(2025, 1, 1)) as dag:
        first = ringflow_pipeline("a", dataset_uri="builtin:wine", model_name="wine-a", epochs=2, batch_size=8,
                                  learning_rate=0.01, store_uri=str(tmp_path))
        second = ringflow_pipeline("b", dataset_uri="builtin:wine", model_name="wine-b", epochs=3, batch_size=8,
                                   learning_rate=0.01, store_uri=str(tmp_path), train_retries=0)
        first >> second
    assert len(dag.task_ids) == 10
    assert dag.get_task("b.validate").upstream_task_ids == {"a.promote"}
    assert dag.get_task("a.train").retries == 1 and dag.get_task("b.train").retries == 0
    assert dag.get_task("a.validate").suite["expectations"][1]["kwargs"] == {"column": "target"}


class _FakeTI:
    def __init__(self, try_number: int, xcoms: dict):
        self.try_number, self._xcoms = try_number, xcoms

    def xcom_pull(self, task_ids=None, **_):
        return self._xcoms[task_ids]


def _render(task, field: str, *, params: dict, try_number: int = 1, run_id: str, xcoms: dict | None = None):
    context = {"params": params, "ti": _FakeTI(try_number, xcoms or {}), "dag": task.dag, "run_id": run_id}
    return task.render_template(getattr(task, field), context, jinja_env=task.dag.get_template_env())


def test_wiring_templates_render_what_the_tasks_need(dagbag, store):
    from ringflow.operators import layout

    dag = dagbag.dags["ringflow_retrain"]
    params = {**dag.params.dump(), "epochs": 3, "learning_rate": 0.01,
              "job_overrides": {"faults": [{"kind": "crash", "rank": 1, "step": 7}], "seed": 4}}
    run_id = "manual__2025-06-01T10:00:00.123456+00:00"
    train = dag.get_task("digits.train")

    first = json.loads(_render(train, "job_config", params=params, try_number=1, run_id=run_id))
    assert first == {"epochs": 3, "batch_size": 32, "learning_rate": 0.01, "seed": 4,
                     "faults": [{"kind": "crash", "rank": 1, "step": 7}]}
    retry = json.loads(_render(train, "job_config", params=params, try_number=2, run_id=run_id))
    assert retry["faults"] == [] and retry["seed"] == 4  # faults on the first try only

    run_uri = _render(train, "run_uri", params=params, run_id=run_id)
    assert run_uri == layout.run_uri(str(store), "ringflow_retrain", run_id, "digits")
    assert run_uri.endswith("/runs/ringflow_retrain/manual__2025-06-01T10_00_00.123456_00_00/digits")

    manifest = _render(train, "manifest_uri", params=params, run_id=run_id,
                       xcoms={"digits.shard": {"manifest_uri": "/s/manifest.json"}})
    assert manifest == "/s/manifest.json"
    promote = dag.get_task("digits.promote")
    assert _render(promote, "gate_mode", params={**params, "gate_mode": "min"}, run_id=run_id) == "min"
    assert _render(promote, "run_uri", params=params, run_id=run_id,
                   xcoms={"digits.train": {"run_uri": run_uri}}) == run_uri


def test_job_config_of_a_template_must_be_one_expression():
    from ringflow.operators.pipeline import job_config_template

    with pytest.raises(ValueError, match="one expression"):
        job_config_template(epochs="epochs: {{ params.epochs }}", batch_size=1, learning_rate=0.1)
