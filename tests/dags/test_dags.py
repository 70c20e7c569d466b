"""The DAG files, without running them: they import cleanly, their Params refuse bad values, the pipeline
TaskGroup composes more than once, and the wiring templates render to what the tasks need."""
from __future__ import annotations

import subprocess
import sys

from pathlib import Path

import pytest

PIPELINE = ["validate", "shard", "train", "evaluate", "promote"]
DAGS = Path(__file__).resolve().parents[2] / "dags"  # the repository's DAG folder


def test_dags_import_without_errors(dagbag):
    assert set(dagbag.dag_ids) == {"ringflow_retrain", "ringflow_retrain_on_asset", "ringflow_two_models",
                                   "ringflow_images", "ringflow_sweep", "ringflow_retrain_approved",
                                   "ringflow_user_script"}
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


@pytest.mark.job
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
                                   "learning_rate", "gate_metric", "gate_mode", "job_overrides", "engine")} == {
        "dataset_uri": "builtin:digits", "model_name": "digits-mlp", "num_workers": 2, "epochs": 5,
        "batch_size": 32, "learning_rate": 0.002, "gate_metric": "accuracy", "gate_mode": "max",
        "job_overrides": {}, "engine": "horovod"}
    assert params.get_param("engine").schema["enum"] == ["horovod", "ddp", "tensorflow"]
    schema = params.get_param("num_workers").schema
    assert (schema["type"], schema["minimum"], schema["maximum"]) == ("integer", 1, 16)


@pytest.mark.parametrize("conf", [
    {"num_workers": 0}, {"num_workers": 17}, {"num_workers": 1.5}, {"epochs": 0}, {"epochs": 1001},
    {"batch_size": 0}, {"batch_size": 5000}, {"learning_rate": 0}, {"learning_rate": -0.1},
    {"gate_mode": "median"}, {"gate_metric": "f1"}, {"model_name": "no spaces/allowed"},
    {"job_overrides": "not an object"}, {"dataset_uri": ""}, {"engine": "deepspeed"}, {"engine": ""},
    # Only datasets the DAG's digits suite passes, and only files training can read.
    {"dataset_uri": "builtin:wine"}, {"dataset_uri": "builtin:diabetes"}, {"dataset_uri": "/data/digits.json"},
    # Production form: no fault injection, nothing that changes where the run reads or writes, no code to import.
    {"job_overrides": {"faults": [{"kind": "crash", "rank": 1, "step": 3}]}},
    {"job_overrides": {"manifest_uri": "s3://other-team/shards/manifest.json"}},
    {"job_overrides": {"run_uri": "s3://other-team/runs/x"}},
    {"job_overrides": {"checkpoint": {"uri": "s3://other-team/runs/x"}}},
    {"job_overrides": {"model": {"kind": "custom", "factory": "my_pkg.models:build"}}},
    {"job_overrides": {"epochs": 500}},  # has its own bounded Param
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
                   "engine": "ddp",
                   "gate_metric": "loss", "gate_threshold": 0.3, "dataset_uri": "s3://data/in/digits v2.parquet",
                   "job_overrides": {"checkpoint": {"every_steps": 10, "keep_last": 2}, "seed": 4,
                                     "health": {"stall_seconds": 300}, "model": {"hidden": [32], "dropout": 0.1},
                                     "ddp": {"bucket_cap_mb": 4}}})
    assert params.validate()["num_workers"] == 16 and params.validate()["engine"] == "ddp"
    params.update({"engine": "tensorflow", "job_overrides": {"tensorflow": {"communication": "ring"}}})
    assert params.validate()["engine"] == "tensorflow"
    for uri in ("builtin:digits", "/data/digits.csv", "file:///data/digits.parquet"):
        params.update({"dataset_uri": uri})
        assert params.validate()["dataset_uri"] == uri


def _offered_builtins(dag) -> list[str]:
    """The built-in datasets the DAG's Dataset field accepts."""
    import copy

    from airflow.sdk.definitions.param import ParamValidationError

    from ringflow.training.formats.datasets import BUILTIN

    offered = []
    for name in BUILTIN:
        params = copy.deepcopy(dag.params)
        try:
            params.update({"dataset_uri": f"builtin:{name}"})
            params.validate()
        except ParamValidationError:
            continue
        offered.append(name)
    return offered


@pytest.mark.parametrize("dag_id", ["ringflow_retrain", "ringflow_retrain_on_asset"])
def test_the_form_offers_only_datasets_its_suite_passes(dagbag, dag_id):
    """Every built-in the Dataset field accepts, or its description names, passes the DAG's own validate
    task: its suite and the input gate."""
    import re

    dag = dagbag.dags[dag_id]
    offered = _offered_builtins(dag)
    assert offered == ["digits"]
    described = re.findall(r"builtin:(\w+)", dag.params.get_param("dataset_uri").description)
    assert described and set(described) <= set(offered)
    validate = dag.get_task("digits.validate")
    for name in offered:
        validate.dataset_uri = f"builtin:{name}"
        result = validate.execute(context={})  # raises DataValidationError, with the reasons, if it fails
        assert result["dataset"] == f"builtin:{name}"


def test_each_fixed_dataset_passes_its_own_suite(dagbag):
    dag = dagbag.dags["ringflow_two_models"]
    for group in ("digits", "diabetes"):
        validate = dag.get_task(f"{group}.validate")
        assert validate.dataset_uri == f"builtin:{group}"
        assert validate.execute(context={})["suite"] == group


def test_pipeline_composes_twice_in_one_dag(dagbag, store):
    from ringflow.training.core.runs import store_layout

    dag = dagbag.dags["ringflow_two_models"]
    assert sorted(dag.task_ids) == sorted(f"{g}.{s}" for g in ("digits", "diabetes") for s in PIPELINE)
    for group in ("digits", "diabetes"):  # two separate chains, nothing crosses between them
        for upstream, downstream in zip(PIPELINE, PIPELINE[1:]):
            assert dag.get_task(f"{group}.{upstream}").downstream_task_ids == {f"{group}.{downstream}"}
    digits, diabetes = dag.get_task("digits.train"), dag.get_task("diabetes.train")
    ti = _FakeTI(1, {}, dag_id=dag.dag_id)
    assert digits.run_folder({"ti": ti}) == store_layout.run_uri(str(store), dag.dag_id, ti.run_id, "digits")
    assert diabetes.run_folder({"ti": ti}) == store_layout.run_uri(str(store), dag.dag_id, ti.run_id, "diabetes")
    assert "digits.shard" in digits.manifest_uri and "diabetes.shard" in diabetes.manifest_uri
    assert dag.get_task("diabetes.promote").gate.mode == "min"
    assert dag.get_task("diabetes.promote").gate.metric == "mse"


def test_factory_in_a_new_dag_with_plain_values(tmp_path):
    """Without Params: plain values, a suite given inline, the default store, two groups."""
    import datetime as dt

    from airflow.sdk import DAG

    from ringflow.operators.pipeline import ringflow_pipeline
    from ringflow.operators.pipeline_specs import DataSpec, TrainingSpec

    with DAG("factory_twice", schedule=None, start_date=dt.datetime(2025, 1, 1)) as dag:
        first = ringflow_pipeline("a", data=DataSpec("builtin:wine"), model_name="wine-a", store_uri=str(tmp_path),
                                  training=TrainingSpec(epochs=2, batch_size=8, learning_rate=0.01))
        second = ringflow_pipeline("b", data=DataSpec("builtin:wine"), model_name="wine-b", store_uri=str(tmp_path),
                                   training=TrainingSpec(epochs=3, batch_size=8, learning_rate=0.01, retries=0))
        first >> second
    assert len(dag.task_ids) == 10
    assert dag.get_task("b.validate").upstream_task_ids == {"a.promote"}
    assert dag.get_task("a.train").retries == 1 and dag.get_task("b.train").retries == 0
    assert dag.get_task("a.validate").suite["expectations"][1]["kwargs"] == {"column": "target"}


class _FakeTI:
    def __init__(self, try_number: int, xcoms: dict, dag_id: str = "ringflow_retrain",
                 run_id: str = "manual__2025-06-01T10:00:00.123456+00:00"):
        self.try_number, self._xcoms = try_number, xcoms
        self.dag_id, self.run_id, self.task_id = dag_id, run_id, "digits.train"

    def xcom_pull(self, task_ids=None, **_):
        return self._xcoms[task_ids]


def _render(task, field: str, *, params: dict, try_number: int = 1, run_id: str, xcoms: dict | None = None):
    context = {"params": params, "ti": _FakeTI(try_number, xcoms or {}, run_id=run_id), "dag": task.dag,
               "run_id": run_id}
    return task.render_template(getattr(task, field), context, jinja_env=task.dag.get_template_env())


def test_the_tasks_turn_the_form_into_a_job_and_a_gate(dagbag, store):
    """What the form's Params render to in the task arguments, and what the tasks make of it when they run:
    the job config, the run folder, the gate."""
    from ringflow.training.core.runs import store_layout
    from ringflow.training.core.gate import build_gate
    from ringflow.operators.train import build_job_config, worker_count

    dag = dagbag.dags["ringflow_retrain"]
    params = {**dag.params.dump(), "epochs": 3, "learning_rate": 0.01, "num_workers": 4,
              "job_overrides": {"checkpoint": {"every_steps": 10}, "seed": 4}}
    run_id = "manual__2025-06-01T10:00:00.123456+00:00"
    train = dag.get_task("digits.train")

    def rendered(task, field, **kw):
        return _render(task, field, params={**params, **kw}, run_id=run_id,
                       xcoms={"digits.shard": {"manifest_uri": "/s/manifest.json"}})

    config = build_job_config(manifest_uri=rendered(train, "manifest_uri"), run_uri="/r",
                              overrides=rendered(train, "job_config"), epochs=rendered(train, "epochs"),
                              batch_size=rendered(train, "batch_size"),
                              learning_rate=rendered(train, "learning_rate"), engine=rendered(train, "engine"))
    assert {k: config[k] for k in ("manifest_uri", "epochs", "batch_size", "learning_rate", "seed", "faults",
                                   "engine")} == {
        "manifest_uri": "/s/manifest.json", "epochs": 3, "batch_size": 32, "learning_rate": 0.01, "seed": 4,
        "faults": [], "engine": "horovod"}
    assert build_job_config(manifest_uri="/s/manifest.json", run_uri="/r",
                            engine=rendered(train, "engine", engine="ddp"))["engine"] == "ddp"
    assert config["checkpoint"]["every_steps"] == 10
    assert worker_count(rendered(train, "num_workers")) == 4

    run_uri = train.run_folder({"ti": _FakeTI(2, {}, run_id=run_id)})  # the same on every try
    assert run_uri == store_layout.run_uri(str(store), "ringflow_retrain", run_id, "digits")
    assert run_uri.endswith("/runs/ringflow_retrain/manual__2025-06-01T10_00_00.123456_00_00/digits")

    promote = dag.get_task("digits.promote")
    assert _render(promote, "run_uri", params=params, run_id=run_id,
                   xcoms={"digits.train": {"run_uri": run_uri}}) == run_uri
    gate = build_gate(metric=rendered(promote, "metric"), mode=rendered(promote, "mode"),
                      threshold=rendered(promote, "threshold"))
    assert (gate.metric, gate.mode, gate.threshold) == ("accuracy", "max", None)  # an empty threshold field
    gate = build_gate(metric=rendered(promote, "metric", gate_metric="loss"),
                      mode=rendered(promote, "mode", gate_mode="min"),
                      threshold=rendered(promote, "threshold", gate_threshold=0.3))
    assert (gate.metric, gate.mode, gate.threshold) == ("loss", "min", 0.3)


def test_injected_faults_apply_on_the_first_try_only(tmp_path):
    """Tests (not the deployed forms) inject faults through the factory's job_config; the train task keeps
    them on its first try only (unless a fault names another try: `on_try`)."""
    import datetime as dt

    from airflow.sdk import DAG

    from ringflow.operators.pipeline import ringflow_pipeline
    from ringflow.operators.pipeline_specs import DataSpec, TrainingSpec

    fault = {"kind": "crash", "rank": 1, "step": 7}
    with DAG("faulty", schedule=None, start_date=dt.datetime(2025, 1, 1)) as dag:
        ringflow_pipeline("a", data=DataSpec("builtin:wine"), model_name="wine-a", store_uri=str(tmp_path),
                          training=TrainingSpec(epochs=2, batch_size=8, learning_rate=0.01,
                                                job_config={"faults": [fault], "seed": 4}))
    train = dag.get_task("a.train")
    train.manifest_uri = "/s/manifest.json"  # what rendering gives
    first, retry = train.build_config("/r", try_number=1), train.build_config("/r", try_number=2)
    assert [f["kind"] for f in first["faults"]] == ["crash"] and first["seed"] == 4 and first["epochs"] == 2
    assert retry["faults"] == [] and retry["seed"] == 4


APPROVED = ["validate", "shard", "train", "evaluate", "approve", "promote"]


def test_the_approval_gate_sits_between_evaluate_and_promote_only_when_required(dagbag):
    from ringflow.operators.approval import PromotionApprovalOperator

    for dag_id in ("ringflow_retrain", "ringflow_retrain_on_asset", "ringflow_two_models", "ringflow_images"):
        assert not [t for t in dagbag.dags[dag_id].tasks if isinstance(t, PromotionApprovalOperator)], dag_id
    dag = dagbag.dags["ringflow_retrain_approved"]
    assert sorted(dag.task_ids) == sorted(f"digits.{step}" for step in APPROVED)
    for upstream, downstream in zip(APPROVED, APPROVED[1:]):
        assert dag.get_task(f"digits.{upstream}").downstream_task_ids == {f"digits.{downstream}"}
    approve, promote = dag.get_task("digits.approve"), dag.get_task("digits.promote")
    assert isinstance(approve, PromotionApprovalOperator)
    assert approve.response_timeout.total_seconds() == 24 * 3600 and approve.defaults == ["Reject"]
    # the question shows the gate promote applies, on the run promote promotes
    assert (approve.name, approve.run_uri, approve.metric, approve.mode, approve.store_uri) == (
        promote.name, promote.run_uri, promote.metric, promote.mode, promote.store_uri)


def test_factory_with_approval_and_its_options(tmp_path):
    import datetime as dt

    from airflow.sdk import DAG

    from ringflow.operators.pipeline import pipeline_tasks
    from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrainingSpec

    with DAG("approved", schedule=None, start_date=dt.datetime(2025, 1, 1)):
        tasks = pipeline_tasks(data=DataSpec("builtin:wine"), model_name="wine", store_uri=str(tmp_path),
                               training=TrainingSpec(epochs=2, batch_size=8, learning_rate=0.01),
                               gate=GateSpec(metric="mse", mode="min", require_approval=True,
                                             approval_timeout=dt.timedelta(minutes=30), approvers=["alice"]))
    assert list(tasks) == APPROVED
    approve = tasks["approve"]
    assert approve.upstream_task_ids == {"evaluate"} and approve.downstream_task_ids == {"promote"}
    assert tasks["promote"].upstream_task_ids == {"approve"}
    assert (approve.gate.metric, approve.gate.mode) == ("mse", "min")
    assert approve.response_timeout == dt.timedelta(minutes=30)
    assert approve.assigned_users == [{"id": "alice", "name": "alice"}]
    with pytest.raises(ValueError, match="approval_timeout is"):  # refused before any task exists
        GateSpec(require_approval=True, approval_timeout=dt.timedelta(0))


def test_airflow_never_parses_the_training_scripts_as_dag_files():
    """dags/.airflowignore keeps scripts/ out of the DAG folder's files: a script runs on the ranks only."""
    from airflow.utils.file import list_py_file_paths

    files = list_py_file_paths(str(DAGS), safe_mode=False)
    assert any(f.endswith("ringflow_user_script.py") for f in files)
    assert not [f for f in files if "/scripts/" in f]


def test_the_user_script_form_offers_only_the_script_folders_and_refuses_any_other_name(dagbag):
    import copy

    from airflow.sdk.definitions.param import ParamValidationError

    params = dagbag.dags["ringflow_user_script"].params
    offered = params.get_param("script").schema["enum"]
    assert "ddp_digits" in offered and params["script"] == "ddp_digits"
    assert offered == sorted(p.parent.name for p in (DAGS / "scripts").glob("*/train.py"))
    for name in ("../ddp_digits", "/tmp/evil", "ddp_digits/../../x", "not_a_script"):
        refused = copy.deepcopy(params)
        with pytest.raises(ParamValidationError):
            refused.update({"script": name})
            refused.validate()
