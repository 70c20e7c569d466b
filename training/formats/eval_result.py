"""eval.json: a checkpoint's metrics on the held-out split. evaluate.py writes it; promote, its approval, a
sweep's selection and `ringflow promote` read it, all through here.

    {"format": "ringflow.eval/v1", "metrics": {"accuracy": 0.95, "loss": 0.2} | {"mse", "mae", "r2", "loss"},
     "checkpoint": "ckpt-000000340", "step": 340, "rows": 389, "task": "classification" | "regression",
     "evaluated_at": "2026-01-01T00:00:00Z"}

Strict: a file that is not this (not JSON, a metric that is not a number, a field missing) is an
EvalResultError naming the file and saying to evaluate again. Torch-free and Airflow-free.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from .run_layout import EVAL

FORMAT = "ringflow.eval/v1"
TASKS = ("classification", "regression")


class EvalResultError(ValueError):
    """eval.json is not an evaluation this ringflow can read; the message names the file and the fix."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class EvalResult:
    metrics: Mapping[str, float]
    checkpoint: str
    step: int
    rows: int
    task: str
    evaluated_at: str

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, Mapping) or not self.metrics:
            raise EvalResultError(f"metrics is {self.metrics!r}; give a non-empty mapping of metric name to number")
        bad = {k: v for k, v in self.metrics.items() if not isinstance(k, str) or not _number(v)}
        if bad:
            raise EvalResultError(f"metrics {bad} are not numbers; every metric is a number (NaN allowed)")
        object.__setattr__(self, "metrics", {k: float(v) for k, v in self.metrics.items()})
        if not isinstance(self.checkpoint, str) or not self.checkpoint:
            raise EvalResultError(f"checkpoint is {self.checkpoint!r}; name the checkpoint that was evaluated")
        for name in ("step", "rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EvalResultError(f"{name} is {value!r}; use a whole number >= 0")
        if self.task not in TASKS:
            raise EvalResultError(f"task is {self.task!r}; use one of {list(TASKS)}")

    def to_dict(self) -> dict[str, Any]:
        """The document, metrics as plain floats (NaN/Inf as the strings 'nan'/'inf', as in result.json)."""
        metrics = {k: v if math.isfinite(v) else repr(v) for k, v in self.metrics.items()}
        return {"format": FORMAT, **dataclasses.asdict(self), "metrics": metrics}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False).encode()

    @classmethod
    def from_dict(cls, doc: Any, where: str = EVAL) -> "EvalResult":
        if not isinstance(doc, Mapping):
            raise EvalResultError(f"{where} holds a {type(doc).__name__}, not an evaluation; evaluate the run again")
        if doc.get("format", FORMAT) != FORMAT:
            raise EvalResultError(f"{where} is format {doc.get('format')!r}, not {FORMAT!r}: read it with the "
                                  f"ringflow that wrote it, or evaluate the run again")
        metrics = doc.get("metrics")
        if isinstance(metrics, Mapping):  # "nan"/"inf" as to_dict writes them
            metrics = {k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in metrics.items()}
        try:
            return cls(metrics=metrics, checkpoint=doc["checkpoint"], step=doc["step"], rows=doc["rows"],
                       task=doc["task"], evaluated_at=str(doc["evaluated_at"]))
        except KeyError as exc:
            raise EvalResultError(f"{where} has no {exc}; evaluate the run again (ringflow evaluate RUN_URI)") from None
        except EvalResultError as exc:
            raise EvalResultError(f"{where}: {exc}; evaluate the run again (ringflow evaluate RUN_URI)") from None

    @classmethod
    def from_json(cls, raw: bytes | str, where: str = EVAL) -> "EvalResult":
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise EvalResultError(f"{where} is not JSON ({exc}); evaluate the run again") from None
        return cls.from_dict(doc, where)
