"""One expectation's result added up over the batches it ran on, and GX's results read into them."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from .scopes import EVERY_ROW
from .summary import Failure

MAX_EXAMPLES = 5


def _plain(value: Any) -> Any:
    """Examples as readable JSON-able values: NaN shows as null, numpy scalars as Python ones."""
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


@dataclasses.dataclass
class Outcome:
    """One expectation's result, added up over batches."""

    expectation: str
    kwargs: dict[str, Any]
    success: bool = True
    elements: int = 0
    missing: int = 0
    unexpected: int | None = None
    examples: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)  # (value, row)
    observed: Any = None
    error: str | None = None

    def add(self, success: bool, details: Mapping[str, Any], error: str | None) -> None:
        if error and self.error is None:
            self.error = error
        if details.get("unexpected_count") is not None:
            self.unexpected = (self.unexpected or 0) + int(details["unexpected_count"])
            self.elements += int(details.get("element_count") or 0)
            self.missing += int(details.get("missing_count") or 0)
            values = list(details.get("partial_unexpected_list") or [])
            rows = list(details.get("partial_unexpected_index_list") or [None] * len(values))
            for value, row in zip(values, rows):
                if len(self.examples) < MAX_EXAMPLES:
                    self.examples.append((_plain(value), _plain(row)))
        elif not success and self.observed is None:
            self.observed = _plain(details.get("observed_value"))
        self.success = self.success and success

    def passed(self) -> bool:
        if self.error:
            return False
        if self.unexpected is None:
            return self.success
        mostly = float(self.kwargs.get("mostly", 1.0) or 1.0)
        checked = self.elements - self.missing
        return self.unexpected == 0 or (checked > 0 and 1 - self.unexpected / checked >= mostly)

    def failure(self, scope: str, sample_rows: int) -> Failure:
        checked = self.elements - self.missing
        percent = 100 * self.unexpected / checked if self.unexpected is not None and checked else None
        return Failure(expectation=self.expectation, kwargs=self.kwargs, unexpected_count=self.unexpected,
                       unexpected_percent=percent if self.unexpected is not None else None,
                       examples=[v for v, _ in self.examples],
                       example_rows=[r for _, r in self.examples if r is not None],
                       observed=self.observed, error=self.error, scope=scope, sample_rows=sample_rows)


def outcome_key(expectation: str, kwargs: Mapping[str, Any]) -> str:
    return json.dumps([expectation, {k: v for k, v in kwargs.items() if k != "batch_id"}], sort_keys=True,
                      default=str)


def add_gx_results(outcomes: dict[str, Outcome], result: Any) -> None:
    for r in result.results:
        config, details, exc = r.expectation_config, r.result or {}, r.exception_info or {}
        kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
        # exception_info is either one dict or a dict of them keyed by metric.
        errors = [exc] if "raised_exception" in exc else list(exc.values())
        error = next((e.get("exception_message") for e in errors if isinstance(e, dict) and e.get("raised_exception")), None)
        outcome = outcomes.setdefault(outcome_key(config.type, kwargs), Outcome(config.type, kwargs))
        outcome.add(bool(r.success), details, error)


def failures_of(outcomes: Mapping[str, Outcome], scope_of: Mapping[str, str], sample_rows: int) -> list[Failure]:
    failures = [o.failure(scope_of.get(o.expectation, EVERY_ROW), sample_rows)
                for o in outcomes.values() if not o.passed()]
    failures.sort(key=lambda f: (f.expectation, json.dumps(f.kwargs, sort_keys=True, default=str)))
    return failures
