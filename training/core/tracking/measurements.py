"""What a run measured, as MLflow metrics with their step: the health records' per-step loss and gradient-sync
measurements, the run's result, and the evaluation. Pure functions over the documents the run folder holds.

A step record holds one value per rank for the times; a metric is one number per step, so they become the
slowest rank's time (what the step waited for) and the share of the step spent in the all-reduce.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Iterable, Mapping

from ...formats.run_result import RunResult

STEP_RECORD = "step"


@dataclasses.dataclass(frozen=True)
class Measurement:
    key: str
    value: float
    step: int
    timestamp_ms: int

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"metric key {self.key!r}: give a name")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"metric {self.key!r} step {self.step!r}: give a whole number >= 0")


def _number(value: Any) -> float | None:
    """A record's number; NaN/Inf arrive as the strings health.jsonl writes them as ("nan", "inf")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf"):
        return float(value)
    return None


def _numbers(values: Any) -> list[float]:
    out = [_number(v) for v in values] if isinstance(values, (list, tuple)) else []
    return [v for v in out if v is not None]


def _ms(seconds: Any, default_ms: int) -> int:
    value = _number(seconds)
    return int(value * 1000) if value is not None and math.isfinite(value) else default_ms


def from_step_record(rec: Mapping[str, Any]) -> list[Measurement]:
    """One health 'step' record as metrics at its step; other record kinds give none."""
    if rec.get("type") != STEP_RECORD or isinstance(rec.get("step"), bool) or not isinstance(rec.get("step"), int):
        return []
    step, when = rec["step"], _ms(rec.get("time"), int(time.time() * 1000))
    values: dict[str, float | None] = {
        "train/loss": _number(rec.get("loss")),
        "health/grad_norm": _number(rec.get("grad_norm")),
        "health/samples_per_sec": _number(rec.get("samples_per_sec")),
    }
    step_times, sync_times = _numbers(rec.get("step_time")), _numbers(rec.get("sync_time"))
    compute_times = _numbers(rec.get("compute_time"))
    if step_times:
        values["health/step_time_s"] = max(step_times)
    if sync_times:
        values["health/sync_time_s"] = max(sync_times)
    if compute_times:
        values["health/compute_time_s"] = max(compute_times)
    if step_times and sync_times and sum(step_times) > 0:
        values["health/sync_share"] = sum(sync_times) / sum(step_times)
    if isinstance(rec.get("nonfinite_ranks"), list):
        values["health/nonfinite_ranks"] = float(len(rec["nonfinite_ranks"]))
    return [Measurement(key, value, step, when) for key, value in values.items() if value is not None]


def from_health_records(records: Iterable[Mapping[str, Any]]) -> list[Measurement]:
    return [m for rec in records for m in from_step_record(rec)]


def from_result(result: RunResult, timestamp_ms: int) -> list[Measurement]:
    """The run's own summary at its last step."""
    values = {"result/loss": result.loss,
              "result/samples_per_sec_after_warmup": result.samples_per_sec_after_warmup,
              "result/health_monitor_share_after_warmup": result.health_monitor_share_after_warmup}
    return [Measurement(key, float(value), result.step, timestamp_ms) for key, value in values.items()
            if value is not None]


def from_eval(doc: Mapping[str, Any], timestamp_ms: int) -> list[Measurement]:
    """eval.json's metrics as eval/<name>, at the step of the checkpoint it scored."""
    metrics = doc.get("metrics")
    if not isinstance(metrics, Mapping):
        raise ValueError(f"eval.json has no 'metrics' object (got {type(metrics).__name__}); rerun the evaluate task")
    step = doc.get("step") if isinstance(doc.get("step"), int) and not isinstance(doc.get("step"), bool) else 0
    out = []
    for name, value in metrics.items():
        number = _number(value)
        if number is not None:
            out.append(Measurement(f"eval/{name}", number, step, timestamp_ms))
    return out
