"""What a validation found: each failed expectation (Failure) and the whole verdict (ValidationSummary)."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from .scopes import EVERY_ROW, SAMPLE

if TYPE_CHECKING:
    from ..input_gate import ColumnProblem


@dataclasses.dataclass(frozen=True)
class Failure:
    expectation: str
    kwargs: dict[str, Any]
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    examples: list[Any] = dataclasses.field(default_factory=list)
    example_rows: list[Any] = dataclasses.field(default_factory=list)
    observed: Any = None
    error: str | None = None  # the expectation could not run (e.g. the column does not exist)
    scope: str = EVERY_ROW  # what it was checked on: every row, the schema, the row count, or a sample
    sample_rows: int = 0

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if k != "type_list")
        head = f"{self.expectation}({args})"
        if self.scope == SAMPLE:
            head += f" [on a sample of {self.sample_rows} rows]"
        if self.error:
            return f"{head}: could not be checked: {self.error}"
        if self.unexpected_count is not None:
            rows = "row" if self.unexpected_count == 1 else "rows"
            text = f"{head}: {self.unexpected_count} unexpected {rows} ({self.unexpected_percent or 0:.2f}%)"
            if any(v is not None for v in self.examples):  # all-null examples (a null check) say nothing
                text += f", e.g. values {self.examples}"
            if self.example_rows:
                text += f" at rows {self.example_rows}"
            return text
        return f"{head}: observed {self.observed!r}"


@dataclasses.dataclass(frozen=True)
class ValidationSummary:
    suite: str
    rows: int
    columns: int
    evaluated: int
    failures: list[Failure]
    # Feature and target columns training cannot use (ringflow.training.core.input_gate), whatever the suite says.
    untrainable: tuple[ColumnProblem, ...] = ()
    # Expectation types by scope (EVERY_ROW, SCHEMA, ROW_COUNT, SAMPLE), and the sample's size.
    scopes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    sample_rows: int = 0

    @property
    def success(self) -> bool:
        return not self.failures and not self.untrainable

    @property
    def sampled(self) -> list[str]:
        """The expectations checked on a sample rather than on every row."""
        return list(self.scopes.get(SAMPLE, ()))

    def report(self, dataset: str) -> dict[str, Any]:
        """The short summary the operator returns (XCom) and `ringflow validate` prints."""
        return {"dataset": dataset, "rows": self.rows, "columns": self.columns, "suite": self.suite,
                "expectations": self.evaluated, "sampled": self.sampled, "sample_rows": self.sample_rows}

    def message(self, dataset: str) -> str:
        head = f"dataset {dataset} ({self.rows} rows, {self.columns} columns)"
        if self.failures:
            lines = [f"{head} failed {len(self.failures)} of {self.evaluated} expectations of suite {self.suite!r}:"]
            lines += [f"  - {f.describe()}" for f in self.failures]
        else:
            lines = [f"{head} passed all {self.evaluated} expectations of suite {self.suite!r}, but:"]
        if self.untrainable:
            lines.append(f"{len(self.untrainable)} feature/target column(s) hold values training cannot use "
                         f"(every feature and the target must be a finite number, whatever the suite says):")
            lines += [f"  - {p.describe()}" for p in self.untrainable]
        lines.append("Fix the data at its source (or the expectation, if it is the one that is wrong) "
                     "and clear this task to rerun it.")
        return "\n".join(lines)
