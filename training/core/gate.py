"""The promotion gate: when a candidate may replace the model in production. Pure policy, no I/O.

Promote, its approval, a sweep's selection and `ringflow promote` all decide with it; the registry asks it
again against the production pointer it is about to replace (model_registry.py's compare-and-swap).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from .registry.model_registry import Pointer

DEFAULT_ALLOWED_VERDICTS = ("HEALTHY", "DEGRADED")
MODES = ("max", "min")


class GateError(ValueError):
    """The gate's arguments are not a gate; the message says which one and what to give."""


@dataclasses.dataclass(frozen=True)
class Gate:
    """When a candidate may replace production.

    metric: the name in eval.json's "metrics"; mode: "max" (higher is better) or "min".
    threshold: an absolute bar the metric must reach (>= for max, <= for min), or None.
    compare_to_production: also require "no worse than the model in production".
    allowed_verdicts: health verdicts of the training run that may be promoted (None: any).
    require_no_remediation: refuse a run whose retries changed its training (`remediation: "auto"` applied a
    remedy: a lower learning rate, a smaller batch, ...; the result's `remedies`): the owner reviews such a
    model before it replaces production.
    """

    metric: str = "accuracy"
    mode: str = "max"
    threshold: float | None = None
    compare_to_production: bool = True
    allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS
    require_no_remediation: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise GateError(f"gate metric is {self.metric!r}; name a metric of eval.json, e.g. 'accuracy' or 'mse'")
        if self.mode not in MODES:
            raise GateError(f"gate mode is {self.mode!r}; use 'max' (higher is better) or 'min' (lower is better)")
        threshold = self.threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or math.isnan(threshold)):
            raise GateError(f"gate threshold is {threshold!r}; use a number, or None for no absolute bar")
        if not isinstance(self.require_no_remediation, bool):
            raise GateError(f"gate require_no_remediation is {self.require_no_remediation!r}; use True or False")

    def _no_worse(self, value: float, bar: float) -> bool:
        return value >= bar if self.mode == "max" else value <= bar

    def check(self, verdict: str | None, metrics: dict[str, Any], production: Pointer | None,
              remedies: Sequence[Mapping[str, Any]] = ()) -> str | None:
        """None if the candidate passes, else the reason it does not, in words. remedies: what the training
        run's retries changed (RunResult.remedies)."""
        if self.require_no_remediation and remedies:
            from .remediation import remedy_words

            changed = "; ".join(remedy_words(r) for r in remedies)
            return (f"the training run was remediated ({changed}) and the gate requires no remediation; review the "
                    "run and promote it by hand, or set require_no_remediation=False")
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
               allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS,
               require_no_remediation: bool = False) -> Gate:
    """The Gate from the operator's arguments as they rendered: a threshold from a template is text
    ("0.9"; "", "None" or "null" for none)."""
    if isinstance(threshold, str):
        text = threshold.strip()
        try:
            threshold = None if text in ("", "None", "null") else float(text)
        except ValueError:
            raise GateError(f"gate threshold rendered to {threshold!r}; use a number, or leave it empty for "
                             f"no absolute bar") from None
    return Gate(metric=str(metric).strip() if isinstance(metric, str) else metric,
                mode=str(mode).strip() if isinstance(mode, str) else mode, threshold=threshold,
                compare_to_production=compare_to_production,
                allowed_verdicts=tuple(allowed_verdicts) if allowed_verdicts is not None else None,
                require_no_remediation=require_no_remediation)
