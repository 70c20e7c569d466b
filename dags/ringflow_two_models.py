"""Two models from one DAG: the pipeline TaskGroup composed twice, side by side.

  digits    classifier on the digits images, promoted when its accuracy is no worse (max)
  diabetes  regression of disease progression, promoted when its mean squared error is no worse (min)

Each group has its own shards, run folder (runs/<dag_id>/<run_id>/<group>/) and registry entry.
"""
from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from ringflow.operators.pipeline import ringflow_pipeline
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrainingSpec
from ringflow.training.core.runs import store_layout

STORE = store_layout.default_store_uri()

with DAG(
    "ringflow_two_models",
    schedule="0 4 * * 1",
    start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["ringflow", "horovod"],
    doc_md=__doc__,
    params={
        "num_workers": Param(2, type="integer", minimum=1, maximum=16, title="Workers (each model)"),
        "epochs": Param(5, type="integer", minimum=1, maximum=1000, title="Epochs"),
    },
):
    ringflow_pipeline(
        "digits", model_name="digits-mlp", store_uri=STORE,
        data=DataSpec("builtin:digits", suite="suites/digits.json"),
        training=TrainingSpec(num_workers="{{ params.num_workers }}", epochs="{{ params.epochs }}", batch_size=32,
                              learning_rate=0.002),
        gate=GateSpec(metric="accuracy", mode="max"),
    )
    ringflow_pipeline(
        "diabetes", model_name="diabetes-mlp", store_uri=STORE,
        data=DataSpec("builtin:diabetes", suite="suites/diabetes.json"),
        training=TrainingSpec(num_workers="{{ params.num_workers }}", epochs="{{ params.epochs }}", batch_size=16,
                              learning_rate=0.01),
        gate=GateSpec(metric="mse", mode="min"),
    )
