"""Promote a trained checkpoint to production when the run earned it, or roll production back: the Airflow
adapters of ringflow.training.core.promotion (the gate, the reads of result.json and eval.json, the registry's
compare-and-swap) and of the registry's rollback. `ringflow promote` and `ringflow rollback` run the same steps.

A gate that says "no" is a normal outcome, not an error: the task succeeds and returns
`{"promoted": False, "reason": ...}` (set `fail_on_gate=True` to fail it instead). A run that did not
succeed, or files that are missing, are errors (RunNotReady, raised as AirflowException): there is nothing
sound to decide on.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_store_for
from ringflow.operators.tracking import MlflowTracking
from ringflow.training.core.gate import DEFAULT_ALLOWED_VERDICTS, Gate, build_gate
from ringflow.training.core.promotion import promote_run
from ringflow.training.core.run_reader import EvaluatedRun, RunNotReady, read_evaluated_run, run_folder_in
from ringflow.training.core.registry.model_registry import ModelRegistry, ProductionMoved
from ringflow.training.core.tracking.settings import DEFAULT_ALIAS


class PromotionGateFailed(AirflowException):
    """The run did not pass the promotion gate and `fail_on_gate` is set."""


class RunNotPromotable(AirflowException):
    """The run cannot be judged (core's RunNotReady): not trained, not succeeded, not evaluated."""


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def evaluated_run(store_uri: str, run_uri: str, conn_id: str | None) -> tuple[Any, EvaluatedRun]:
    """(the registry's store, the run as promote reads it); RunNotPromotable when it cannot be judged."""
    store = open_store_for(store_uri, conn_id)
    try:
        return store, read_evaluated_run(run_folder_in(store, store_uri, run_uri))
    except RunNotReady as exc:
        raise RunNotPromotable(str(exc)) from exc


class GateArguments:
    """The gate's arguments on an operator (promote, its approval, a sweep's selection): kept as given, since
    metric, mode and threshold may be templates, and built into a Gate (`gate`) when the task runs."""

    def keep_gate_arguments(self, *, metric: Any, mode: Any, threshold: Any, compare_to_production: bool,
                            allowed_verdicts: Sequence[str] | None, require_no_remediation: bool = False) -> None:
        self.metric, self.mode, self.threshold = metric, mode, threshold
        self.require_no_remediation = require_no_remediation
        self.compare_to_production = compare_to_production
        self.allowed_verdicts = tuple(allowed_verdicts) if allowed_verdicts is not None else None
        if not any(is_template(v) for v in (metric, mode, threshold)):
            self.gate  # noqa: B018 - plain values are checked when the DAG is parsed, not after a long run

    @property
    def gate(self) -> Gate:
        """The gate from the arguments as they are now: rendered, once the task runs."""
        return build_gate(metric=self.metric, mode=self.mode, threshold=self.threshold,
                          compare_to_production=self.compare_to_production, allowed_verdicts=self.allowed_verdicts,
                          require_no_remediation=self.require_no_remediation)


class PromoteModelOperator(GateArguments, BaseOperator):
    """Copy the run's checkpoint into the registry and point production at it, if the gate allows.

    store_uri: the registry's store (models under `models/<name>/`); run_uri: the run's folder,
    which must be inside that store so the copy happens server-side.
    Returns (XCom) `{"promoted": bool, "reason": str, "version": N | None, "new_version": bool,
    "previous": M | None, "metric": name, "value": x}`. `version` is the registry version holding the
    run's checkpoint: None when the gate refused before copying; set but not promoted when another
    promotion landed first and the gate then refused against it. `previous` is the version in
    production when the gate last decided.

    require_no_remediation: refuse a run whose retries changed its training (the train task's
    `remediation: "auto"` applied a remedy; its result's `remedies`), whatever its metrics.
    mlflow_conn_id: an MLflow server's Airflow connection (operators/tracking.py): a promotion also registers
    the checkpoint as a version of MLflow model `name` and points `mlflow_alias` at it (XCom
    "mlflow_version"); None: no MLflow. mlflow_experiment: where the run's MLflow run is (default: the DAG id).
    """

    template_fields: Sequence[str] = ("name", "store_uri", "run_uri", "conn_id", "metric", "mode", "threshold")

    def __init__(self, *, name: str, store_uri: str, run_uri: str, conn_id: str | None = DEFAULT_S3_CONN_ID,
                 metric: str = "accuracy", mode: str = "max", threshold: float | str | None = None,
                 compare_to_production: bool = True,
                 allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS,
                 require_no_remediation: bool = False,
                 fail_on_gate: bool = False, mlflow_conn_id: str | None = None, mlflow_alias: str = DEFAULT_ALIAS,
                 mlflow_experiment: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name, self.store_uri, self.run_uri, self.conn_id = name, store_uri, run_uri, conn_id
        self.mlflow_conn_id, self.mlflow_alias, self.mlflow_experiment = mlflow_conn_id, mlflow_alias, mlflow_experiment
        MlflowTracking.optional(mlflow_conn_id, alias=mlflow_alias)  # a bad alias fails when the DAG is parsed
        self.fail_on_gate = fail_on_gate
        self.keep_gate_arguments(metric=metric, mode=mode, threshold=threshold,
                                 compare_to_production=compare_to_production, allowed_verdicts=allowed_verdicts,
                                 require_no_remediation=require_no_remediation)

    def execute(self, context: Any) -> dict[str, Any]:
        gate = self.gate
        store = open_store_for(self.store_uri, self.conn_id)
        try:
            outcome = promote_run(store, self.store_uri, self.run_uri, self.name, gate)
        except RunNotReady as exc:
            raise RunNotPromotable(str(exc)) from exc
        doc = outcome.to_dict()
        if not outcome.promoted:
            message = outcome.refusal(self.name)
            self.log.warning("%s", message)
            if self.fail_on_gate:
                raise PromotionGateFailed(message)
            return doc
        self.log.info("model %r version %d is in production (previous: %s, new version: %s)",
                      self.name, outcome.version, outcome.previous, outcome.new_version)
        tracking = MlflowTracking.optional(self.mlflow_conn_id, alias=self.mlflow_alias,
                                           experiment=self.mlflow_experiment, conn_id=self.conn_id)
        if tracking is not None:  # after the store's pointer moved: MLflow follows ringflow's registry
            checkpoint = outcome.run.result.checkpoint
            doc["mlflow_version"] = tracking.register(context, run_uri=self.run_uri, checkpoint=checkpoint,
                                                      model_name=self.name, store_version=outcome.version,
                                                      metrics=dict(outcome.run.metrics),
                                                      run_folder=run_folder_in(store, self.store_uri, self.run_uri))
        return doc


class RollbackModelOperator(BaseOperator):
    """Point production back at the previous version (or `to_version`). Returns the new pointer.

    from_version: roll back only if production is still this version (default: whichever version is
    in production when the task starts). If a promotion lands first, the task fails without retry
    and changes nothing: a retry would roll back the version that just landed, which nobody looked at.
    """

    template_fields: Sequence[str] = ("name", "store_uri", "conn_id")

    def __init__(self, *, name: str, store_uri: str, conn_id: str | None = DEFAULT_S3_CONN_ID,
                 to_version: int | None = None, from_version: int | None = None, mlflow_conn_id: str | None = None,
                 mlflow_alias: str = DEFAULT_ALIAS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name, self.store_uri, self.conn_id, self.to_version = name, store_uri, conn_id, to_version
        self.from_version = from_version
        # mlflow_conn_id: the alias moves back too, to the MLflow version of the restored one (operators/tracking.py)
        self.mlflow_conn_id, self.mlflow_alias = mlflow_conn_id, mlflow_alias
        MlflowTracking.optional(mlflow_conn_id, alias=mlflow_alias)  # a bad alias fails when the DAG is parsed

    def execute(self, context: Any) -> dict[str, Any]:
        registry = ModelRegistry(open_store_for(self.store_uri, self.conn_id))
        try:
            pointer = registry.rollback(self.name, to_version=self.to_version, from_version=self.from_version)
        except ProductionMoved as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("model %r: production is now version %d", self.name, pointer.version)
        tracking = MlflowTracking.optional(self.mlflow_conn_id, alias=self.mlflow_alias, conn_id=self.conn_id)
        if tracking is not None:
            return {**dataclasses.asdict(pointer),
                    "mlflow_version": tracking.rolled_back(model_name=self.name, store_version=pointer.version)}
        return dataclasses.asdict(pointer)
