"""Promote a trained checkpoint to production when the run earned it, or roll production back.

The run folder (inside the registry's store) holds what the earlier tasks wrote:

    result.json   the train task's RunResult (ringflow.training.formats.run_result): status, final checkpoint, verdict
    eval.json     {"metrics": {"accuracy": 0.95, "loss": 0.2}, ...}
    checkpoints/  the checkpoints (ringflow.training.formats.checkpoint layout)

A gate that says "no" is a normal outcome, not an error: the task succeeds and returns
`{"promoted": False, "reason": ...}` (set `fail_on_gate=True` to fail it instead). A run that did not
succeed, or files that are missing, are errors: there is nothing sound to decide on.

Other promotions of the same model may run at the same time (two DAGs sharing a model). The gate is
checked once before copying anything (a clearly worse run costs no copy), and again by the registry
against the production pointer it is about to replace, after every lost race for it: a run is never
compared with a pointer that has since changed.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_store_for
from ringflow.operators.tracking import MlflowTracking
from ringflow.training.core.tracking.settings import DEFAULT_ALIAS
from ringflow.training.core.registry.model_registry import ModelRegistry, Pointer, ProductionMoved, run_key_in
from ringflow.training.formats.run_folder import EvalUnreadable, RunFolder
from ringflow.training.formats.run_result import ResultError, RunResult
from ringflow.training.store.base import ObjectStore

DEFAULT_ALLOWED_VERDICTS = ("HEALTHY", "DEGRADED")
MODES = ("max", "min")


class PromotionGateFailed(AirflowException):
    """The run did not pass the promotion gate and `fail_on_gate` is set."""


@dataclasses.dataclass(frozen=True)
class Gate:
    """When a candidate may replace production.

    metric: the name in eval.json's "metrics"; mode: "max" (higher is better) or "min".
    threshold: an absolute bar the metric must reach (>= for max, <= for min), or None.
    compare_to_production: also require "no worse than the model in production".
    allowed_verdicts: health verdicts of the training run that may be promoted (None: any).
    """

    metric: str = "accuracy"
    mode: str = "max"
    threshold: float | None = None
    compare_to_production: bool = True
    allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"gate metric is {self.metric!r}; name a metric of eval.json, e.g. 'accuracy' or 'mse'")
        if self.mode not in MODES:
            raise ValueError(f"gate mode is {self.mode!r}; use 'max' (higher is better) or 'min' (lower is better)")
        threshold = self.threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or math.isnan(threshold)):
            raise ValueError(f"gate threshold is {threshold!r}; use a number, or None for no absolute bar")

    def _no_worse(self, value: float, bar: float) -> bool:
        return value >= bar if self.mode == "max" else value <= bar

    def check(self, verdict: str | None, metrics: dict[str, Any], production: Pointer | None) -> str | None:
        """None if the candidate passes, else the reason it does not, in words."""
        if self.allowed_verdicts is not None and verdict is None:
            return ("the training run has no health verdict (trained with health.enabled false?); turn health "
                    "monitoring on, or set allowed_verdicts=None to promote without a health gate")
        if self.allowed_verdicts is not None and verdict not in self.allowed_verdicts:
            return (f"the training run's health verdict is {verdict!r}, not one of {list(self.allowed_verdicts)}; "
                    f"look at the run's health report before promoting it by hand")
        value = metrics[self.metric]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            return f"metric {self.metric!r} is {value!r}, not a number"
        word = ">=" if self.mode == "max" else "<="
        if self.threshold is not None and not self._no_worse(value, self.threshold):
            return f"{self.metric} {value:g} does not reach the threshold ({word} {self.threshold:g})"
        if self.compare_to_production and production is not None:
            current = production.metrics.get(self.metric)
            if not isinstance(current, (int, float)) or isinstance(current, bool):
                return (f"production version {production.version} has no numeric {self.metric!r} metric to compare "
                        f"with; set compare_to_production=False (with a threshold) to promote anyway")
            if not self._no_worse(value, current):
                return (f"{self.metric} {value:g} is worse than production version {production.version} "
                        f"({current:g}; {self.mode} is better)")
        return None


def build_gate(*, metric: Any = "accuracy", mode: Any = "max", threshold: Any = None,
               compare_to_production: bool = True,
               allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS) -> Gate:
    """The Gate from the operator's arguments as they rendered: a threshold from a template is text
    ("0.9"; "", "None" or "null" for none)."""
    if isinstance(threshold, str):
        text = threshold.strip()
        try:
            threshold = None if text in ("", "None", "null") else float(text)
        except ValueError:
            raise ValueError(f"gate threshold rendered to {threshold!r}; use a number, or leave it empty for "
                             f"no absolute bar") from None
    return Gate(metric=str(metric).strip() if isinstance(metric, str) else metric,
                mode=str(mode).strip() if isinstance(mode, str) else mode, threshold=threshold,
                compare_to_production=compare_to_production,
                allowed_verdicts=tuple(allowed_verdicts) if allowed_verdicts is not None else None)


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def run_folder_in(store: ObjectStore, store_uri: str, run_uri: str) -> RunFolder:
    """The run folder `run_uri` inside the registry's store (opened once, with its connection): the
    registry copies a checkpoint server-side, so the run must be inside it (run_key_in refuses one that
    is not)."""
    return RunFolder(store.child(run_key_in(store_uri, run_uri)), uri=run_uri)


def read_run_result(run: RunFolder) -> RunResult:
    """The run's published result (RunFolder.read_result: the current attempt's); AirflowException when the
    train task left none (or a broken one)."""
    try:
        result = run.read_result()
    except ResultError as exc:
        raise AirflowException(str(exc)) from exc
    if result is None:
        raise AirflowException(f"{run.uri_of('result.json')} does not exist (no attempt published one): the "
                               f"train task did not finish this run")
    return result


def read_evaluated_run(run: RunFolder) -> tuple[RunResult, dict[str, Any]]:
    """The result and eval metrics of a run that may be promoted (what promote and its approval read), or
    AirflowException saying why it may not: training did not succeed, or the evaluate task did not run."""
    result = read_run_result(run)
    if not result.succeeded:
        raise AirflowException(
            f"run {run.uri} has status {result.status!r} (attempt {result.attempt}, verdict "
            f"{result.verdict.status if result.verdict else None}): only a succeeded run with a checkpoint "
            "can be promoted"
        )
    try:
        evaluation = run.read_eval()
    except EvalUnreadable as exc:
        raise AirflowException(str(exc)) from exc
    if evaluation is None:
        raise AirflowException(f"{run.eval_uri} does not exist: the evaluate task did not run")
    return result, evaluation["metrics"]


class GateArguments:
    """The gate's arguments on an operator (promote, its approval, a sweep's selection): kept as given, since
    metric, mode and threshold may be templates, and built into a Gate (`gate`) when the task runs."""

    def keep_gate_arguments(self, *, metric: Any, mode: Any, threshold: Any, compare_to_production: bool,
                            allowed_verdicts: Sequence[str] | None) -> None:
        self.metric, self.mode, self.threshold = metric, mode, threshold
        self.compare_to_production = compare_to_production
        self.allowed_verdicts = tuple(allowed_verdicts) if allowed_verdicts is not None else None
        if not any(is_template(v) for v in (metric, mode, threshold)):
            self.gate  # noqa: B018 - plain values are checked when the DAG is parsed, not after a long run

    @property
    def gate(self) -> Gate:
        """The gate from the arguments as they are now: rendered, once the task runs."""
        return build_gate(metric=self.metric, mode=self.mode, threshold=self.threshold,
                          compare_to_production=self.compare_to_production, allowed_verdicts=self.allowed_verdicts)


class PromoteModelOperator(GateArguments, BaseOperator):
    """Copy the run's checkpoint into the registry and point production at it, if the gate allows.

    store_uri: the registry's store (models under `models/<name>/`); run_uri: the run's folder,
    which must be inside that store so the copy happens server-side.
    Returns (XCom) `{"promoted": bool, "reason": str, "version": N | None, "new_version": bool,
    "previous": M | None, "metric": name, "value": x}`. `version` is the registry version holding the
    run's checkpoint: None when the gate refused before copying; set but not promoted when another
    promotion landed first and the gate then refused against it. `previous` is the version in
    production when the gate last decided.

    mlflow_conn_id: an MLflow server's Airflow connection (operators/tracking.py): a promotion also registers
    the checkpoint as a version of MLflow model `name` and points `mlflow_alias` at it (XCom
    "mlflow_version"); None: no MLflow. mlflow_experiment: where the run's MLflow run is (default: the DAG id).
    """

    template_fields: Sequence[str] = ("name", "store_uri", "run_uri", "conn_id", "metric", "mode", "threshold")

    def __init__(self, *, name: str, store_uri: str, run_uri: str, conn_id: str | None = DEFAULT_S3_CONN_ID,
                 metric: str = "accuracy", mode: str = "max", threshold: float | str | None = None,
                 compare_to_production: bool = True,
                 allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS,
                 fail_on_gate: bool = False, mlflow_conn_id: str | None = None, mlflow_alias: str = DEFAULT_ALIAS,
                 mlflow_experiment: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name, self.store_uri, self.run_uri, self.conn_id = name, store_uri, run_uri, conn_id
        self.mlflow_conn_id, self.mlflow_alias, self.mlflow_experiment = mlflow_conn_id, mlflow_alias, mlflow_experiment
        MlflowTracking.optional(mlflow_conn_id, alias=mlflow_alias)  # a bad alias fails when the DAG is parsed
        self.fail_on_gate = fail_on_gate
        self.keep_gate_arguments(metric=metric, mode=mode, threshold=threshold,
                                 compare_to_production=compare_to_production, allowed_verdicts=allowed_verdicts)

    def execute(self, context: Any) -> dict[str, Any]:
        gate = self.gate
        store = open_store_for(self.store_uri, self.conn_id)
        run = run_folder_in(store, self.store_uri, self.run_uri)
        result, metrics = read_evaluated_run(run)
        if gate.metric not in metrics:
            raise AirflowException(
                f"{run.eval_uri} has no metric {gate.metric!r} (metrics: {sorted(metrics)}); "
                "set metric= to one it has"
            )
        registry = ModelRegistry(store)
        production = registry.production(self.name)
        verdict = result.verdict.status if result.verdict else None
        outcome = {"metric": gate.metric, "value": metrics[gate.metric], "verdict": verdict,
                   "checkpoint": result.checkpoint, "previous": production.version if production else None}

        # A first look, so a run that is clearly worse costs no copy. Not the decision: production
        # may change before this promotion lands, so the registry asks the gate again (below).
        reason = gate.check(verdict, metrics, production)
        if reason is not None:
            return self._refused(result, reason, {**outcome, "version": None, "new_version": False})

        promotion = registry.promote(self.name, run_uri=self.run_uri, checkpoint=result.checkpoint, metrics=metrics,
                                     decide=lambda current: gate.check(verdict, metrics, current))
        outcome.update(previous=promotion.previous, version=promotion.version, new_version=promotion.new_version)
        if not promotion.promoted:
            return self._refused(result, promotion.reason or "", outcome)
        self.log.info("model %r version %d is in production (revision %s, previous: %s, new version: %s)",
                      self.name, promotion.version, promotion.pointer.revision if promotion.pointer else None,
                      promotion.previous, promotion.new_version)
        tracking = MlflowTracking.optional(self.mlflow_conn_id, alias=self.mlflow_alias,
                                           experiment=self.mlflow_experiment, conn_id=self.conn_id)
        if tracking is not None:  # after the store's pointer moved: MLflow follows ringflow's registry
            outcome["mlflow_version"] = tracking.register(context, run_uri=self.run_uri, checkpoint=result.checkpoint,
                                                          model_name=self.name, store_version=promotion.version,
                                                          metrics=metrics, run_folder=run)
        return {**outcome, "promoted": True, "reason": "passed the gate"}

    def _refused(self, result: RunResult, reason: str, outcome: dict[str, Any]) -> dict[str, Any]:
        message = f"not promoting {result.checkpoint} of {self.run_uri} as model {self.name!r}: {reason}"
        if outcome.get("version") is not None:
            message += f" (its files stay in the registry as version {outcome['version']}, not in production)"
        self.log.warning("%s", message)
        if self.fail_on_gate:
            raise PromotionGateFailed(message)
        return {**outcome, "promoted": False, "reason": reason}


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
