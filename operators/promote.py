"""Promote a trained checkpoint to production when the run earned it, or roll production back.

The run folder (inside the registry's store) holds what the earlier tasks wrote:

    result.json   {"status": "succeeded", "checkpoint": "ckpt-...", "verdict": {"status": "HEALTHY", ...}}
    eval.json     {"metrics": {"accuracy": 0.95, "loss": 0.2}, ...}
    checkpoints/  the checkpoints (ringflow.training.checkpoint layout)

A gate that says "no" is a normal outcome, not an error: the task succeeds and returns
`{"promoted": False, "reason": ...}` (set `fail_on_gate=True` to fail it instead). A run that did not
succeed, or files that are missing, are errors: there is nothing sound to decide on.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ringflow.operators.connections import DEFAULT_CONN_ID, open_store_for
from ringflow.operators.model_registry import ModelRegistry, Pointer, run_prefix_in
from ringflow.training.store.base import ObjectNotFound, ObjectStore, join_key

RESULT_FILE = "result.json"
EVAL_FILE = "eval.json"
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
        if self.mode not in MODES:
            raise ValueError(f"gate mode is {self.mode!r}; use 'max' (higher is better) or 'min' (lower is better)")

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


def _read_json(store: ObjectStore, key: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(store.get_bytes(key))
    except ObjectNotFound as exc:
        raise AirflowException(f"{store.uri}/{key} does not exist: {what}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AirflowException(f"{store.uri}/{key} is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise AirflowException(f"{store.uri}/{key} is not a JSON object")
    return doc


class PromoteModelOperator(BaseOperator):
    """Copy the run's checkpoint into the registry and point production at it, if the gate allows.

    store_uri: the registry's store (models under `models/<name>/`); run_uri: the run's folder,
    which must be inside that store so the copy happens server-side.
    Returns (XCom) `{"promoted": bool, "reason": str, "version": N | None, "new_version": bool,
    "previous": M | None, "metric": name, "value": x}`.
    """

    template_fields: Sequence[str] = ("name", "store_uri", "run_uri", "conn_id")

    def __init__(self, *, name: str, store_uri: str, run_uri: str, conn_id: str | None = DEFAULT_CONN_ID,
                 metric: str = "accuracy", mode: str = "max", threshold: float | None = None,
                 compare_to_production: bool = True,
                 allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS,
                 fail_on_gate: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name, self.store_uri, self.run_uri, self.conn_id = name, store_uri, run_uri, conn_id
        # Built now so a bad mode fails when the DAG is parsed, not at the end of a long run.
        self.gate = Gate(metric=metric, mode=mode, threshold=threshold, compare_to_production=compare_to_production,
                         allowed_verdicts=tuple(allowed_verdicts) if allowed_verdicts is not None else None)
        self.fail_on_gate = fail_on_gate

    def execute(self, context: Any) -> dict[str, Any]:
        store = open_store_for(self.store_uri, self.conn_id)
        run_prefix = run_prefix_in(self.store_uri, self.run_uri)
        result = _read_json(store, join_key(run_prefix, RESULT_FILE), "the train task did not finish this run")
        if result.get("status") != "succeeded" or not result.get("checkpoint"):
            raise AirflowException(
                f"run {self.run_uri} has status {result.get('status')!r} and checkpoint "
                f"{result.get('checkpoint')!r}: only a succeeded run with a checkpoint can be promoted"
            )
        metrics = _read_json(store, join_key(run_prefix, EVAL_FILE), "the evaluate task did not run").get("metrics")
        if not isinstance(metrics, dict) or self.gate.metric not in metrics:
            raise AirflowException(
                f"{self.run_uri}/{EVAL_FILE} has no metric {self.gate.metric!r} (metrics: "
                f"{sorted(metrics) if isinstance(metrics, dict) else metrics!r}); set metric= to one it has"
            )
        registry = ModelRegistry(store)
        production = registry.production(self.name)
        verdict = (result.get("verdict") or {}).get("status")
        outcome = {"metric": self.gate.metric, "value": metrics[self.gate.metric], "verdict": verdict,
                   "checkpoint": result["checkpoint"], "previous": production.version if production else None}

        reason = self.gate.check(verdict, metrics, production)
        if reason is not None:
            message = f"not promoting {result['checkpoint']} of {self.run_uri} as model {self.name!r}: {reason}"
            self.log.warning("%s", message)
            if self.fail_on_gate:
                raise PromotionGateFailed(message)
            return {**outcome, "promoted": False, "reason": reason, "version": None, "new_version": False}

        promotion = registry.promote(self.name, run_prefix=run_prefix, checkpoint=result["checkpoint"],
                                     metrics=metrics, source_run=self.run_uri)
        self.log.info("model %r version %d is in production (previous: %s, new version: %s)",
                      self.name, promotion.version, promotion.previous, promotion.new_version)
        return {**outcome, "promoted": True, "reason": "passed the gate", "version": promotion.version,
                "new_version": promotion.new_version}


class RollbackModelOperator(BaseOperator):
    """Point production back at the previous version (or `to_version`). Returns the new pointer."""

    template_fields: Sequence[str] = ("name", "store_uri", "conn_id")

    def __init__(self, *, name: str, store_uri: str, conn_id: str | None = DEFAULT_CONN_ID,
                 to_version: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name, self.store_uri, self.conn_id, self.to_version = name, store_uri, conn_id, to_version

    def execute(self, context: Any) -> dict[str, Any]:
        registry = ModelRegistry(open_store_for(self.store_uri, self.conn_id))
        pointer = registry.rollback(self.name, to_version=self.to_version)
        self.log.info("model %r: production is now version %d", self.name, pointer.version)
        return dataclasses.asdict(pointer)
