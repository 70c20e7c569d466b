"""A sweep: train the digits classifier with several configurations, promote the best healthy one.

validate and shard run once; `candidate` is a mapped TaskGroup (train >> evaluate), one copy per entry of the
`configurations` Param (job_config overrides: learning rate, batch size, model), each in its own run folder
(runs/<dag_id>/<run_id>/digits.candidate/m<i>/) with its own health verdict; `select_and_promote` promotes
the best candidate by accuracy whose training succeeded with an allowed verdict, if it is no worse than
production. Its XCom lists every candidate with the reason it did not win.
"""
from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from ringflow.operators.sweep import SWEEP_CONFIGURATIONS_PARAM, ringflow_sweep
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrainingSpec
from ringflow.training.core.registry.model_registry import MODEL_NAME_PATTERN
from ringflow.training.core.runs import store_layout

STORE = store_layout.default_store_uri()

with DAG(
    "ringflow_sweep",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,  # the configurations reach the plan task as a list
    tags=["ringflow", "horovod", "sweep"],
    doc_md=__doc__,
    params={
        "model_name": Param("digits-mlp", type="string", pattern=MODEL_NAME_PATTERN, title="Model name"),
        "num_workers": Param(2, type="integer", minimum=1, maximum=16, title="Workers (each candidate)"),
        "epochs": Param(5, type="integer", minimum=1, maximum=1000, title="Epochs (default of each candidate)"),
        "configurations": Param([{"learning_rate": 0.01}, {"learning_rate": 0.002},
                                 {"learning_rate": 0.002, "model": {"kind": "mlp", "hidden": [128, 64]}}],
                                **SWEEP_CONFIGURATIONS_PARAM),
    },
):
    ringflow_sweep(
        "digits", model_name="{{ params.model_name }}", store_uri=STORE,
        configurations="{{ params.configurations }}",
        data=DataSpec("builtin:digits", suite="suites/digits.json"),
        training=TrainingSpec(num_workers="{{ params.num_workers }}", epochs="{{ params.epochs }}", batch_size=32,
                              learning_rate=0.002),
        gate=GateSpec(metric="accuracy", mode="max"),
    )
