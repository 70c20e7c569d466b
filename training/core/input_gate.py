"""The one check every table passes before anything is written for training: its feature and target columns
hold finite real numbers, whatever a validation suite says about them.

Training reads every feature as float32 (and a regression target too), so a null, NaN, ±inf, a value beyond
float32's range, or text cannot be trained on: sharding would turn it into NaN or inf, and the first step
would go NaN. This module finds such values and says where they are; it is pure (a DataFrame in, a list of
problems out) and imports neither Airflow nor torch, so the validate task, `write_shards` and `ringflow shard`
all call the same function before they write anything.

It streams: `InputGate.add` takes one record batch (or DataFrame) at a time and keeps only counts and the
first examples, so a table of any size is checked in the memory of one batch, over every row. A tensor-valued
column (a fixed-shape tensor or fixed-size list: an image, a frame) is checked element by element: a row is
bad when any of its elements is; a variable-length list has no fixed shape and cannot be a feature.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ..formats.tensor_columns import column_shape, tensor_matrix

# Features (and a regression target) are stored and trained as float32: anything larger becomes inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_EXAMPLES = 5

# Why a value is unusable, in the order a report lists them.
NULL, INFINITE, TOO_LARGE, NOT_A_NUMBER = "null/NaN", "inf", "beyond float32", "non-numeric"
NOT_FIXED_SHAPE = "variable-length list"
KINDS = (NULL, INFINITE, TOO_LARGE, NOT_A_NUMBER, NOT_FIXED_SHAPE)


def feature_columns(columns: Sequence[Any], target: str, features: Sequence[str] | None = None) -> list[str]:
    """The columns training uses as features: `features` when given, else every column but the target
    (what write_shards stores in the partitions)."""
    return list(features) if features else [c for c in columns if c != target]


@dataclasses.dataclass(frozen=True)
class ColumnProblem:
    """One column training cannot use: what is wrong, in how many rows, with examples.
    `bad_rows` is None when the column itself is missing."""

    column: str
    role: str  # "feature" or "target"
    rows: int
    bad_rows: int | None
    kinds: tuple[tuple[str, int], ...] = ()  # (kind, rows) for each kind found, in KINDS order
    examples: tuple[Any, ...] = ()  # the first bad values, as plain Python values (None for null/NaN)
    example_rows: tuple[int, ...] = ()  # their row numbers, from 0
    columns: tuple[str, ...] = ()  # the table's columns, to name in a missing-column message

    def __post_init__(self) -> None:
        if self.role not in ("feature", "target"):
            raise ValueError(f"role is {self.role!r}; use 'feature' or 'target'")
        if self.bad_rows is not None and not 0 < self.bad_rows <= self.rows:
            raise ValueError(f"bad_rows is {self.bad_rows} of {self.rows} rows; a problem has 1..rows bad rows")
        if len(self.examples) != len(self.example_rows):
            raise ValueError("examples and example_rows must pair up")

    def describe(self) -> str:
        if self.bad_rows is None:
            return (f"{self.role} column {self.column!r} is not in the dataset; columns are {list(self.columns)}"
                    + ("; pass the right target column name" if self.role == "target" else ""))
        verb = "is not a finite number" if self.bad_rows == 1 else "are not finite numbers"
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.kinds)
        text = (f"{self.role} column {self.column!r}: {self.bad_rows} of {self.rows} rows "
                f"({100 * self.bad_rows / self.rows:.2f}%) {verb} ({kinds})")
        return text + f", e.g. values {list(self.examples)} at rows {list(self.example_rows)}"


class UntrainableData(ValueError):
    """Feature or target columns hold values training cannot use. `problems` lists them by column."""

    def __init__(self, problems: Sequence[ColumnProblem], dataset: str = "") -> None:
        self.problems = tuple(problems)
        super().__init__(message(self.problems, dataset))


def message(problems: Sequence[ColumnProblem], dataset: str = "") -> str:
    where = f"dataset {dataset}" if dataset else "the dataset"
    lines = [f"{where} cannot be trained on: feature and target columns must hold finite numbers, and "
             f"{len(problems)} column{'s' if len(problems) != 1 else ''} do{'es' if len(problems) == 1 else ''} not:"]
    lines += [f"  - {p.describe()}" for p in problems]
    lines.append("Fix or drop these rows at the source (or encode text as numbers) and run again; "
                 "nothing was written.")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError):  # e.g. a pandas Timestamp has no scalar .item()
            pass
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return None
    return value if isinstance(value, (bool, int, float, str)) else str(value)  # readable, JSON-able


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, np.timedelta64)


def _kinds_per_row(series: pd.Series) -> np.ndarray:
    """For each row, the index in KINDS of why its value is unusable, or -1 when it is a finite float32."""
    n = len(series)
    null = series.isna().to_numpy(dtype=bool)
    numeric = (pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_complex_dtype(series))
    if numeric:
        is_number = np.ones(n, dtype=bool)
        values = series.to_numpy(dtype="float64", na_value=np.nan)
    else:  # object, string, category, datetime...: judge each value; numbers stored as objects still count
        is_number = np.fromiter((_is_real(v) for v in series.array), dtype=bool, count=n)
        values = np.full(n, np.nan)
        if is_number.any():
            values[is_number] = np.asarray([float(v) for v in series.array[is_number]], dtype="float64")
    with np.errstate(invalid="ignore"):
        infinite = np.isinf(values)
        too_large = np.isfinite(values) & (np.abs(values) > FLOAT32_MAX)
    kind = np.full(n, -1)
    kind[~is_number & ~null] = KINDS.index(NOT_A_NUMBER)
    kind[too_large] = KINDS.index(TOO_LARGE)
    kind[infinite] = KINDS.index(INFINITE)
    kind[null] = KINDS.index(NULL)
    return kind


def _tensor_kinds(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """For a tensor-valued column: each row's kind index (or -1) and the first bad element of each row."""
    n = len(column)
    shape, element = column_shape(column.type)
    if -1 in shape:
        return np.full(n, KINDS.index(NOT_FIXED_SHAPE)), np.full(n, None, dtype=object)
    if not (pa.types.is_integer(element) or pa.types.is_floating(element) or pa.types.is_boolean(element)):
        return np.full(n, KINDS.index(NOT_A_NUMBER)), np.full(n, None, dtype=object)
    values, row_null = tensor_matrix(column, np.float64)
    with np.errstate(invalid="ignore"):
        element_kind = np.full(values.shape, -1)
        element_kind[np.isfinite(values) & (np.abs(values) > FLOAT32_MAX)] = KINDS.index(TOO_LARGE)
        element_kind[np.isinf(values)] = KINDS.index(INFINITE)
        element_kind[np.isnan(values)] = KINDS.index(NULL)
    # A row takes its most serious kind (null, then inf, then too large: KINDS order), like a scalar.
    ranked = np.where(element_kind >= 0, len(KINDS) - element_kind, 0)
    worst = ranked.max(axis=1) if values.shape[1] else np.zeros(n, dtype=int)
    kind = np.where(worst > 0, len(KINDS) - worst, -1)
    kind[row_null] = KINDS.index(NULL)
    first = np.argmax(ranked > 0, axis=1) if values.shape[1] else np.zeros(n, dtype=int)
    example = values[np.arange(n), first] if values.shape[1] else np.full(n, np.nan)
    return kind, example.astype(object)


def _surely_fine(column: pa.Array) -> bool:
    """A cheap first look (the common case: a clean numeric column): True when every value is certainly a
    finite float32; False means "look row by row"."""
    import pyarrow.compute as pc

    type_ = column.type
    if column.null_count:
        return False
    if pa.types.is_integer(type_) or pa.types.is_boolean(type_):
        return True  # even int64's largest value is far below float32's
    if not pa.types.is_floating(type_) or not len(column):
        return not len(column)
    if not pc.all(pc.is_finite(column)).as_py():
        return False
    return type_ != pa.float64() or pc.max(pc.abs(column)).as_py() <= FLOAT32_MAX


class InputGate:
    """The check, streamed: `add` one batch at a time (record batches or DataFrames), then `problems()`. A
    batch may hold any of the columns: a wide table can be fed one column group at a time, each group's rows
    in order. Memory: counts and at most MAX_EXAMPLES examples per column."""

    def __init__(self, columns: Sequence[Any], target: str, features: Sequence[str] | None = None) -> None:
        self.columns = tuple(map(str, columns))
        self._wanted = [(target, "target")] + [(c, "feature") for c in feature_columns(columns, target, features)]
        self._counts = {c: np.zeros(len(KINDS), dtype=np.int64) for c, _ in self._wanted}
        self._examples: dict[str, list[tuple[int, Any]]] = {c: [] for c, _ in self._wanted}
        self._seen: dict[str, int] = {}  # rows seen of each column: where its next batch starts

    @property
    def rows(self) -> int:
        """Rows of the table seen so far."""
        return max(self._seen.values(), default=0)

    def add(self, batch: "pa.RecordBatch | pa.Table | pd.DataFrame") -> None:
        names = list(batch.columns) if isinstance(batch, pd.DataFrame) else list(batch.schema.names)
        for column, _ in self._wanted:
            if column not in names:
                continue
            first_row = self._seen.get(column, 0)
            if isinstance(batch, pd.DataFrame):
                series, arrow = batch[column], None
            else:
                arrow = batch.column(column)
                if isinstance(arrow, pa.ChunkedArray):
                    arrow = pa.concat_arrays(arrow.chunks) if arrow.num_chunks else pa.array([], arrow.type)
                series = None
            if arrow is not None and _surely_fine(arrow):
                continue
            if arrow is not None and column_shape(arrow.type)[0]:
                kind, values = _tensor_kinds(arrow)
            else:
                series = series if series is not None else arrow.to_pandas()
                kind, values = _kinds_per_row(series), None
            bad = np.flatnonzero(kind >= 0)
            if not len(bad):
                continue
            self._counts[column] += np.bincount(kind[bad], minlength=len(KINDS))
            examples = self._examples[column]
            for i in bad[:MAX_EXAMPLES - len(examples)]:
                examples.append((first_row + int(i), _plain(values[i] if values is not None else series.iloc[i])))
        for name in names:
            self._seen[name] = self._seen.get(name, 0) + len(batch)

    def problems(self) -> list[ColumnProblem]:
        """Every feature or target column training cannot use, target first, then features in order."""
        problems = []
        for column, role in self._wanted:
            if column not in self.columns:
                problems.append(ColumnProblem(column=str(column), role=role, rows=self.rows, bad_rows=None,
                                              columns=self.columns))
                continue
            counts = self._counts[column]
            if not counts.any():
                continue
            examples = self._examples[column]
            problems.append(ColumnProblem(
                column=str(column), role=role, rows=self.rows, bad_rows=int(counts.sum()),
                kinds=tuple((k, int(c)) for k, c in zip(KINDS, counts) if c),
                examples=tuple(v for _, v in examples), example_rows=tuple(r for r, _ in examples)))
        return problems

    def check(self, dataset: str = "") -> None:
        problems = self.problems()
        if problems:
            raise UntrainableData(problems, dataset)


def find_problems(df: "pd.DataFrame | pa.Table", target: str, features: Sequence[str] | None = None) -> list[ColumnProblem]:
    """Every feature or target column of a whole in-memory table training cannot use (InputGate on one batch)."""
    gate = InputGate(df.columns if isinstance(df, pd.DataFrame) else df.schema.names, target, features)
    gate.add(df)
    return gate.problems()


def check_trainable(df: "pd.DataFrame | pa.Table", target: str, features: Sequence[str] | None = None,
                    dataset: str = "") -> None:
    """Raise UntrainableData naming every column, its number of bad rows and examples, if training could
    not use `df`'s feature and target columns."""
    problems = find_problems(df, target, features)
    if problems:
        raise UntrainableData(problems, dataset)
