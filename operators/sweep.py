"""A sweep: train N configurations of one model, promote the best healthy one.

    from ringflow.operators.sweep import ringflow_sweep

    with DAG("my_sweep", params={"configurations": Param([...], **SWEEP_CONFIGURATIONS_PARAM)}):
        ringflow_sweep("digits", model_name="digits-mlp", data=DataSpec("builtin:digits"),
                       training=TrainingSpec(epochs=5, batch_size=32, learning_rate=0.002),
                       configurations="{{ params.configurations }}")

validate >> shard run once; then `configurations` (one `plan` task that checks the list) is expanded over a
mapped TaskGroup `candidate` (Airflow dynamic task mapping) holding train >> evaluate, one copy per
configuration. Each configuration is a job_config override applied last (`{"learning_rate": 0.01}`,
`{"batch_size": 16}`, `{"model": {"hidden": [128]}}`), so every candidate trains on the same shards, in its own
run folder (`runs/<dag_id>/<run_id>/<group>.candidate/m<i>/`, store_layout.run_uri with the map index) with its
own health verdict. A failed candidate fails only its own copy. Then `select_and_promote` (trigger rule
all_done: it runs whatever the candidates did) reads each candidate's result.json and eval.json, picks the best
eligible one by the gate's metric (`select_best`) and promotes it through the registry, asking promote's Gate
again against production inside the registry's compare-and-swap. An unhealthy or failed candidate is never
eligible; when none is, nothing is promoted and the task's XCom and log give the reason for each candidate.
"""
from __future__ import annotations

import ast
import json
from typing import Any, Mapping, Sequence

from airflow.sdk import BaseOperator, TaskGroup, task, task_group

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_store_for
from ringflow.operators.evaluate import EvaluateModelOperator
from ringflow.operators.pipeline import JOB_OVERRIDES_SCHEMA, default_suite_for, gate_arguments, train_operator
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrackingSpec, TrainingSpec
from ringflow.operators.promote import GateArguments
from ringflow.operators.shard import ShardDatasetOperator
from ringflow.operators.tracking import MlflowTracking
from ringflow.operators.train import check_overrides, train_run_uri
from ringflow.operators.validate import ValidateDatasetOperator
from ringflow.training.core.registry.model_registry import ModelRegistry
from ringflow.training.core.runs import store_layout
from ringflow.training.core.tracking.settings import DEFAULT_ALIAS
from ringflow.training.core.gate import DEFAULT_ALLOWED_VERDICTS
from ringflow.training.core.run_reader import run_folder_in
from ringflow.training.core.sweep_selection import read_candidate, select_best

CANDIDATE_GROUP = "candidate"

# A trigger form's `configurations` Param: a list of job_config overrides, each what a production form may
# override (pipeline.JOB_OVERRIDES_SCHEMA) plus the fields a sweep usually varies.
SWEEP_CONFIGURATIONS_PARAM: Mapping[str, Any] = {
    "type": "array", "minItems": 1, "maxItems": 32,
    "items": {**JOB_OVERRIDES_SCHEMA, "properties": {
        **JOB_OVERRIDES_SCHEMA["properties"],
        "learning_rate": {"type": "number", "exclusiveMinimum": 0},
        "batch_size": {"type": "integer", "minimum": 1},
        "epochs": {"type": "integer", "minimum": 1},
    }},
    "title": "Configurations", "description": "one training-config override per candidate, e.g. "
                                              '[{"learning_rate": 0.01}, {"learning_rate": 0.002, "batch_size": 16}]',
}


def checked_configurations(value: Any) -> list[dict[str, Any]]:
    """The list of configurations as the plan task got it (a list, or the text a template rendered it to:
    JSON or a Python literal), checked: a non-empty list of dicts none of which sets what the train operator
    owns (manifest_uri, run_uri). The values themselves are checked by each candidate's train task."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise ValueError(f"configurations rendered to {value!r}, neither JSON nor a Python literal; give "
                                 f"a list of dicts, e.g. [{{\"learning_rate\": 0.01}}]") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"configurations is {value!r}; give a non-empty list of job_config overrides, one per "
                         f"candidate, e.g. [{{\"learning_rate\": 0.01}}, {{\"learning_rate\": 0.002}}]")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"configuration {i} is {item!r}; each configuration is a dict of job_config overrides")
        check_overrides(item)
    return [dict(item) for item in value]


class SelectAndPromoteOperator(GateArguments, BaseOperator):
    """Pick the best healthy candidate of a sweep and promote it (see the module docstring).

    configurations: the list the candidates were mapped over (its length is the number of candidates).
    group_id: the mapped TaskGroup whose train tasks derived the run folders (train.train_run_uri).
    mlflow_conn_id, mlflow_alias: as PromoteModelOperator's: the winner is also registered in MLflow.
    Returns (XCom) `{"promoted", "winner", "reason", "version", "previous", "metric", "value", "candidates":
    [{"index", "run_uri", "verdict", "value", "reason"}]}`.
    """

    template_fields: Sequence[str] = ("name", "store_uri", "configurations", "conn_id", "metric", "mode", "threshold")

    def __init__(self, *, name: str, store_uri: str, configurations: Any, group_id: str,
                 conn_id: str | None = DEFAULT_S3_CONN_ID, metric: str = "accuracy", mode: str = "max",
                 threshold: float | str | None = None, compare_to_production: bool = True,
                 allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS,
                 mlflow_conn_id: str | None = None, mlflow_alias: str = DEFAULT_ALIAS, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "all_done")  # judge failed candidates too: they are reasons, not errors
        super().__init__(**kwargs)
        self.name, self.store_uri, self.configurations, self.group_id = name, store_uri, configurations, group_id
        self.conn_id = conn_id
        self.keep_gate_arguments(metric=metric, mode=mode, threshold=threshold,
                                 compare_to_production=compare_to_production, allowed_verdicts=allowed_verdicts)
        self.mlflow_conn_id, self.mlflow_alias = mlflow_conn_id, mlflow_alias

    def execute(self, context: Any) -> dict[str, Any]:
        ti = context["ti"]
        gate = self.gate
        count = len(checked_configurations(self.configurations))
        store = open_store_for(self.store_uri, self.conn_id)
        runs = [run_folder_in(store, self.store_uri, train_run_uri(self.store_uri, ti, self.group_id, i))
                for i in range(count)]
        candidates = [read_candidate(run, i) for i, run in enumerate(runs)]
        selection = select_best(candidates, gate)
        table = [{"index": c.index, "run_uri": c.run_uri, "verdict": c.verdict,
                  "value": (c.metrics or {}).get(gate.metric), "reason": selection.reasons.get(c.index, "best")}
                 for c in candidates]
        for row in table:
            self.log.info("candidate %d (%s): verdict %s, %s %s: %s", row["index"], row["run_uri"], row["verdict"],
                          gate.metric, row["value"], row["reason"])
        outcome: dict[str, Any] = {"metric": gate.metric, "winner": selection.winner, "candidates": table,
                                   "version": None, "previous": None, "value": None}
        if selection.winner is None:
            reason = "no candidate is eligible: " + "; ".join(f"{i}: {r}" for i, r in sorted(selection.reasons.items()))
            self.log.warning("not promoting model %r: %s", self.name, reason)
            return {**outcome, "promoted": False, "reason": reason}
        best = candidates[selection.winner]
        metrics = dict(best.metrics or {})
        registry = ModelRegistry(store)
        promotion = registry.promote(self.name, run_uri=best.run_uri, checkpoint=best.checkpoint, metrics=metrics,
                                     decide=lambda current: gate.check(best.verdict, metrics, current))
        outcome.update(value=metrics[gate.metric], version=promotion.version, previous=promotion.previous)
        if not promotion.promoted:
            self.log.warning("not promoting candidate %d of model %r: %s", best.index, self.name, promotion.reason)
            return {**outcome, "promoted": False, "reason": promotion.reason}
        self.log.info("model %r version %d (candidate %d, %s %g) is in production (previous: %s)", self.name,
                      promotion.version, best.index, gate.metric, metrics[gate.metric], promotion.previous)
        tracking = MlflowTracking.optional(self.mlflow_conn_id, alias=self.mlflow_alias, conn_id=self.conn_id)
        if tracking is not None:  # after the store's pointer moved: MLflow follows ringflow's registry
            outcome["mlflow_version"] = tracking.register(context, run_uri=best.run_uri, checkpoint=best.checkpoint,
                                                          model_name=self.name, store_version=promotion.version,
                                                          metrics=metrics,
                                                          run_folder=runs[best.index])
        return {**outcome, "promoted": True, "reason": f"candidate {best.index} is the best and passed the gate"}


def ringflow_sweep(group_id: str, *, data: DataSpec, training: TrainingSpec, model_name: Any,
                   configurations: Any, gate: GateSpec = GateSpec(), tracking: TrackingSpec = TrackingSpec(),
                   store_uri: str | None = None, conn_id: str | None = DEFAULT_S3_CONN_ID) -> TaskGroup:
    """validate >> shard >> plan >> candidate[i](train >> evaluate) >> select_and_promote, as TaskGroup `group_id`.

    configurations: a list of job_config overrides, one per candidate, or a template rendering to one
        (`"{{ params.configurations }}"`; SWEEP_CONFIGURATIONS_PARAM is a form schema for it).
    training: every candidate's defaults (its job_config is each configuration: training.job_config must be
        None); batch_size is also the shards' (a candidate's batch size must divide it: the train task's
        preflight says so).
    gate: as ringflow_pipeline's (its approval fields do not apply: the selection promotes the winner).
    Other arguments as ringflow_pipeline's (pipeline_specs.py): each candidate is an MLflow run, the winner a
    version.
    """
    if training.job_config is not None:
        raise ValueError(f"sweep {group_id!r}: TrainingSpec.job_config is {training.job_config!r}, but a sweep's "
                         f"job_config is each of its configurations; put shared overrides in every configuration")
    store = store_uri or store_layout.default_store_uri()
    with TaskGroup(group_id=group_id, tooltip=f"sweep: validate >> shard >> N x (train >> evaluate) >> "
                                              f"select_and_promote ({group_id})") as group:
        validate = ValidateDatasetOperator(task_id="validate", dataset_uri=data.dataset_uri,
                                           suite=data.suite if data.suite is not None else default_suite_for(data.target),
                                           target=data.target, conn_id=conn_id)
        shard = ShardDatasetOperator(task_id="shard", dataset_uri=data.dataset_uri,
                                     output_uri=store_layout.shards_root(store), num_partitions=training.num_workers,
                                     batch_size=training.batch_size, seed=data.seed,
                                     eval_fraction=data.eval_fraction, target=data.target, conn_id=conn_id)

        @task(task_id="plan")
        def plan(value: Any) -> list[dict[str, Any]]:
            """The configurations, checked once, as the list the candidates are mapped over."""
            return checked_configurations(value)

        planned = plan(configurations)

        @task_group(group_id=CANDIDATE_GROUP)
        def candidate(job_config: Any) -> None:
            # run folder: runs/<dag_id>/<run_id>/<group>.candidate/m<map index>/
            train = train_operator(training, tracking, store_uri=store, conn_id=conn_id,
                                   shard_task_id=shard.task_id, job_config=job_config)
            # this copy's own train task: the same map index (an XComArg's ["key"] would name an XCom key)
            run_uri = (f"{{{{ ti.xcom_pull(task_ids='{train.task_id}', map_indexes=ti.map_index)['run_uri'] }}}}")
            evaluate = EvaluateModelOperator(task_id="evaluate", run_uri=run_uri, conn_id=conn_id,
                                             mlflow_conn_id=tracking.mlflow_conn_id)
            train >> evaluate

        candidates = candidate.expand(job_config=planned)
        select = SelectAndPromoteOperator(
            task_id="select_and_promote", name=model_name, store_uri=store, configurations=planned,
            group_id=candidates.group_id, conn_id=conn_id, **gate_arguments(gate),
            mlflow_conn_id=tracking.mlflow_conn_id, mlflow_alias=tracking.alias)
        validate >> shard >> planned
        candidates >> select
    return group
