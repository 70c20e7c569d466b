"""Two models from one DAG: the pipeline TaskGroup composed twice, side by side.

  digits    classifier on the digits images, promoted when its accuracy is no worse (max)
  diabetes  regression of disease progression, promoted when its mean squared error is no worse (min)

Each group has its own shards, run folder (runs/<dag_id>/<run_id>/<group>/) and registry entry.
"""
from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from ringflow.operators.pipeline import ringflow_pipeline
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
        "num_workers": Param(2, type="integer", minimum=1, maximum=16, title="Horovod workers (each model)"),
        "epochs": Param(5, type="integer", minimum=1, maximum=1000, title="Epochs"),
    },
):
    ringflow_pipeline(
        "digits", dataset_uri="builtin:digits", model_name="digits-mlp", store_uri=STORE,
        num_workers="{{ params.num_workers }}", epochs="{{ params.epochs }}", batch_size=32, learning_rate=0.002,
        suite="suites/digits.json", gate={"metric": "accuracy", "mode": "max"},
    )
    ringflow_pipeline(
        "diabetes", dataset_uri="builtin:diabetes", model_name="diabetes-mlp", store_uri=STORE,
        num_workers="{{ params.num_workers }}", epochs="{{ params.epochs }}", batch_size=16, learning_rate=0.01,
        suite="suites/diabetes.json", gate={"metric": "mse", "mode": "min"},
    )
