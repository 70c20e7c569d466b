"""Retrain the digits classifier, promoted only when a person approves:
validate >> shard >> train >> evaluate >> approve >> promote.

The approve task (Airflow's human-in-the-loop ApprovalOperator) asks in the UI's "Required actions" (or
`PATCH .../taskInstances/digits.approve/-1/hitlDetails` through the REST API), showing the run's eval metrics
next to production's, its health verdict and what the promotion gate says. Approve: promote runs. Reject:
nothing is promoted and the approve task's log names who rejected it. No answer within 24 hours: rejected.
A run the gate refuses anyway is not put to anyone.
"""
from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from ringflow.operators.pipeline import ringflow_pipeline
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrainingSpec
from ringflow.training.core.registry.model_registry import MODEL_NAME_PATTERN
from ringflow.training.core.runs import store_layout

with DAG("ringflow_retrain_approved", schedule=None, start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
         catchup=False, max_active_runs=1, tags=["ringflow", "horovod", "approval"], doc_md=__doc__,
         default_args={"owner": "ringflow"},
         description="Retrain the digits classifier; a person approves each promotion",
         params={"model_name": Param("digits-mlp", type="string", pattern=MODEL_NAME_PATTERN,
                                     title="Model name", description="registry name: models/<name>/ in the store"),
                 "epochs": Param(5, type="integer", minimum=1, maximum=1000, title="Epochs")}):
    ringflow_pipeline(
        "digits",
        model_name="{{ params.model_name }}",
        store_uri=store_layout.default_store_uri(),
        data=DataSpec("builtin:digits", suite="suites/digits.json"),
        training=TrainingSpec(epochs="{{ params.epochs }}", batch_size=32, learning_rate=0.002),
        gate=GateSpec(require_approval=True, approval_timeout=dt.timedelta(hours=24),
                      # approvers=["alice", "bob"],  # only these users may answer (the auth manager's user ids)
                      ),
    )
