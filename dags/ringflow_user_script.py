"""Train the digits classifier with your own training script: validate >> shard >> train >> evaluate >> promote.

The form offers the script folders of $RINGFLOW_SCRIPTS_DIR (default: this folder's scripts/), each holding a
train.py written against ringflow's training API (ringflow.training.api; dags/scripts/ddp_digits is PyTorch
DDP). The train task packs the picked folder into the run folder and pins its sha256: every rank checks it
before running anything. Evaluate takes the metrics the script reported with report_eval; promote gates them as
any run's, and the promoted version's MODEL.json says how to load the model. A script is picked by name, never
by path: a name not in the folder is refused. What a script imports beyond its folder is the image's business.
"""
from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG, Param

from ringflow.operators.pipeline import ringflow_pipeline
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrainingSpec
from ringflow.training.core.registry.model_registry import MODEL_NAME_PATTERN
from ringflow.training.core.runs import store_layout
from ringflow.training.formats.code_bundle import scripts_dir, scripts_in
from ringflow.training.formats.engines import ENGINES

SCRIPT = "train.py"  # each script folder's entry point
SCRIPTS = scripts_dir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
OFFERED = scripts_in(SCRIPTS, SCRIPT) or ["none"]  # an enum needs a value: "none" is refused when it runs

with DAG("ringflow_user_script", schedule=None, start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
         catchup=False, max_active_runs=1, tags=["ringflow", "user-script"], doc_md=__doc__,
         default_args={"owner": "ringflow"}, description="Train the digits classifier with your own script",
         params={
             "script": Param("ddp_digits" if "ddp_digits" in OFFERED else OFFERED[0], type="string", enum=OFFERED,
                             title="Script", description=f"a folder of {SCRIPTS} holding a {SCRIPT}"),
             "script_args": Param([], type="array", items={"type": "string"}, title="Script arguments"),
             "engine": Param("ddp", type="string", enum=list(ENGINES), title="Engine",
                             description="the one the script is written for (ddp_digits: ddp)"),
             "model_name": Param("digits-script", type="string", pattern=MODEL_NAME_PATTERN, title="Model name"),
             "num_workers": Param(2, type="integer", minimum=1, maximum=16, title="Workers"),
             "epochs": Param(5, type="integer", minimum=1, maximum=1000, title="Epochs"),
         }):
    ringflow_pipeline(
        "digits",
        model_name="{{ params.model_name }}",
        store_uri=store_layout.default_store_uri(),
        data=DataSpec("builtin:digits", suite="suites/digits.json"),
        training=TrainingSpec(num_workers="{{ params.num_workers }}", epochs="{{ params.epochs }}", batch_size=32,
                              learning_rate=0.002, engine="{{ params.engine }}", scripts_dir=SCRIPTS,
                              entry={"script": SCRIPT, "folder": "{{ params.script }}",
                                     "args": "{{ params.script_args }}"}),
        gate=GateSpec(metric="accuracy", mode="max"),
    )
