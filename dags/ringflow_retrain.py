"""Retrain the digits classifier: validate >> shard >> train (Horovod, DDP or TensorFlow) >> evaluate >> promote.

Two DAGs, one pipeline:
  ringflow_retrain           weekly, or triggered by hand from the form the Params below describe
  ringflow_retrain_on_asset  whenever the dataset Asset is updated (a new file dropped in the store)

The embedded default needs nothing but this machine: the built-in digits dataset, a local folder store
($RINGFLOW_STORE, default $AIRFLOW_HOME/ringflow-data) and 2 local Horovod workers.

The form is for production: its training-config overrides cannot inject faults, change where a run reads
and writes (the pipeline owns the shards and the run folder) or load code (JOB_OVERRIDES_SCHEMA), and it
offers only datasets the digits suite passes.
"""
from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Asset, Param

from ringflow.operators.pipeline import JOB_OVERRIDES_SCHEMA, ringflow_pipeline
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrainingSpec
from ringflow.training.formats.engines import DEFAULT_ENGINE, ENGINES, TABLE as ENGINE_TABLE
from ringflow.training.core.registry.model_registry import MODEL_NAME_PATTERN
from ringflow.training.core.runs import store_layout

STORE = store_layout.default_store_uri()
SUITE = "suites/digits.json"
# The built-in datasets this form offers: only those the suite above passes. (wine and diabetes have other
# columns and targets; they would fail validation, and a digits-mlp model trained on them makes no sense.)
OFFERED_BUILTINS = ("digits",)
# What the Dataset field accepts: an offered built-in, or a .csv/.parquet file by path, file:// or s3:// URI.
DATASET_PATTERN = (r"^(builtin:(" + "|".join(OFFERED_BUILTINS) + r")|(file|s3)://.+\.(csv|parquet)"
                   r"|[^:]+\.(csv|parquet))$")
# What an ingestion job (or `POST /api/v2/assets/events`) updates to trigger ringflow_retrain_on_asset.
DIGITS_DROP = store_layout.join(STORE if "://" in STORE else f"file://{STORE}", store_layout.DATASETS, "digits.parquet")
DIGITS_ASSET = Asset(name="ringflow-dataset-digits", uri=DIGITS_DROP)


def params(dataset_default: str) -> dict[str, Param]:
    return {
        "dataset_uri": Param(dataset_default, type="string", minLength=1, pattern=DATASET_PATTERN, title="Dataset",
                             description="builtin:digits, or a .csv/.parquet file of digits (path, file:// or "
                                         "s3:// URI): 64 numeric pixel columns and a 'target' of 0-9, checked "
                                         "by suites/digits.json"),
        "model_name": Param("digits-mlp", type="string", pattern=MODEL_NAME_PATTERN,
                            title="Model name", description="registry name: models/<name>/ in the store"),
        "num_workers": Param(2, type="integer", minimum=1, maximum=16, title="Workers"),
        "epochs": Param(5, type="integer", minimum=1, maximum=1000, title="Epochs"),
        "batch_size": Param(32, type="integer", minimum=1, maximum=4096, title="Batch size per worker"),
        "learning_rate": Param(0.002, type="number", exclusiveMinimum=0, maximum=10, title="Learning rate",
                               description="per worker; scaled by the number of workers"),
        "engine": Param(DEFAULT_ENGINE, type="string", enum=list(ENGINES), title="Engine",
                        description="horovod: Horovod under horovodrun (or an MPIJob or TrainJob); ddp: "
                                    "PyTorch DistributedDataParallel under torchrun (or a TrainJob); tensorflow: "
                                    "TensorFlow MultiWorkerMirroredStrategy, one process per worker started by "
                                    "ringflow with its TF_CONFIG (or a TrainJob)"),
        "gate_metric": Param("accuracy", type="string", enum=["accuracy", "loss"], title="Promotion metric",
                             section="Promotion gate"),
        "gate_mode": Param("max", type="string", enum=["max", "min"], title="Better is",
                           description="max: higher is better (accuracy); min: lower is better (loss)",
                           section="Promotion gate"),
        "gate_threshold": Param(None, type=["null", "number"], title="Threshold",
                                description="the metric must also reach this (empty: only beat production)",
                                section="Promotion gate"),
        "job_overrides": Param({}, **JOB_OVERRIDES_SCHEMA, title="Training config overrides",
                               description="merged into the training job config, e.g. {\"checkpoint\": "
                                           "{\"every_steps\": 20}, \"health\": {\"stall_seconds\": 300}}: "
                                           "checkpoint (every_steps, keep_last), model (mlp: hidden, dropout), "
                                           "optimizer, seed, log_every_steps, gc_every_steps, precision, health, and the "
                                           "engine's section: " + ", ".join(spec.config_section for spec in ENGINE_TABLE.values()),
                               section="Advanced"),
    }


def pipeline() -> None:
    ringflow_pipeline(
        "digits",
        model_name="{{ params.model_name }}",
        store_uri=STORE,
        data=DataSpec("{{ params.dataset_uri }}", suite=SUITE),
        training=TrainingSpec(num_workers="{{ params.num_workers }}", epochs="{{ params.epochs }}",
                              batch_size="{{ params.batch_size }}", learning_rate="{{ params.learning_rate }}",
                              job_config="{{ params.job_overrides }}", engine="{{ params.engine }}"),
        gate=GateSpec(metric="{{ params.gate_metric }}", mode="{{ params.gate_mode }}",
                      threshold="{{ params.gate_threshold }}"),
    )


COMMON = dict(start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc), catchup=False, max_active_runs=1,
              tags=["ringflow", "horovod"], default_args={"owner": "ringflow"})

with DAG("ringflow_retrain", schedule="0 3 * * 1", params=params("builtin:digits"), doc_md=__doc__,
         description="Weekly retrain of the digits classifier", **COMMON):
    pipeline()

with DAG("ringflow_retrain_on_asset", schedule=[DIGITS_ASSET], params=params(DIGITS_DROP), doc_md=__doc__,
         description="Retrain the digits classifier when new digits data lands", **COMMON):
    pipeline()
