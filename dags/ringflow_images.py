"""The digits as 1x8x8 images, trained by a small convolutional network: a tensor-valued column end to end.

  validate  suites/digits_images.json checks the `image` column: shape 1x8x8 float32, no nulls, every pixel in
            [0, 16] (on every row), and the labels
  shard     the image column is stored as a fixed-shape tensor; the manifest records its shape and dtype
  train     the custom-model factory `ringflow.training.rank.models:conv_net` receives (batch, 1, 8, 8) tensors
  evaluate, promote   as for any model (accuracy, no worse than production)
"""
from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from ringflow.operators.pipeline import ringflow_pipeline
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrainingSpec
from ringflow.training.core.runs import store_layout

with DAG(
    "ringflow_images",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["ringflow", "horovod", "images"],
    doc_md=__doc__,
    params={
        "num_workers": Param(2, type="integer", minimum=1, maximum=16, title="Workers"),
        "epochs": Param(5, type="integer", minimum=1, maximum=1000, title="Epochs"),
    },
):
    ringflow_pipeline(
        "digits_images", model_name="digits-cnn", store_uri=store_layout.default_store_uri(),
        data=DataSpec("builtin:digits_images", suite="suites/digits_images.json"),
        training=TrainingSpec(num_workers="{{ params.num_workers }}", epochs="{{ params.epochs }}", batch_size=32,
                              learning_rate=0.005,
                              job_config={"model": {"kind": "custom", "factory": "ringflow.training.rank.models:conv_net",
                                                    "kwargs": {"channels": [16, 32]}}}),
        gate=GateSpec(metric="accuracy", mode="max"),
    )
