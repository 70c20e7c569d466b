"""Check a dataset against a Great Expectations suite before anything is sharded or trained.

A suite is plain data, so it can live in the DAG file or in a JSON file next to it:

    {"name": "digits", "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "target"}}, ...]}

The pure part (load_suite, validate_dataset, summarize) needs no Airflow and is tested on
tables; `ValidateDatasetOperator` only opens the dataset and raises with the summary.
Great Expectations is imported inside the functions: it takes seconds to import, and DAG files
importing this module are parsed over and over by the scheduler.

Validation streams (`validate_dataset`): the dataset is read one record batch at a time (datasets.BATCH_BYTES),
only the columns something checks, a wide Parquet table one column group per pass (datasets.Dataset.column_groups),
each expectation given only the columns it names; so memory grows neither with the rows nor with the columns
(bench/data_memory.py: inside 512 MiB). Each expectation has a scope, reported with every failure:

- every row (exact): GX's column map expectations (`expect_column_values_to_*`: not null, between, in set, in
  type list, match regex, ...) run on each batch and their counts and first examples are added up; so do
  ringflow's tensor expectations and the input gate (every feature and the target finite).
- schema and row count (exact): table expectations about columns run on the schema (a table of no rows);
  `expect_table_row_count_*` run on the exact row count.
- sample: everything else (column aggregates such as mean, median, unique value counts, quantiles, and the
  map expectations that compare rows with each other: uniqueness, increasing/decreasing) runs on a uniform
  sample of at most SAMPLE_ROWS rows (and SAMPLE_BYTES), the same rows for the same data.

ringflow adds two expectations for tensor-valued columns (GX has none): `expect_column_values_to_be_tensors`
(`column`, `shape`, optional `dtype`: every value has that shape) and `expect_column_tensor_values_to_be_between`
(`column`, `min_value`, `max_value`: every element of every value in range).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import pandas as pd
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_store_for

if TYPE_CHECKING:
    from ringflow.training.core.input_gate import ColumnProblem

MAX_EXAMPLES = 5
# The sample aggregate expectations run on: at most this many rows, and this many bytes of them.
SAMPLE_ROWS = 100_000
SAMPLE_BYTES = 64 * 2**20
_SAMPLE_SEED = 0
EVERY_ROW, SCHEMA, ROW_COUNT, SAMPLE = "every row", "schema", "row count", "sample"
ROW_COUNT_EXPECTATIONS = ("expect_table_row_count_to_be_between", "expect_table_row_count_to_equal")
TENSOR_SHAPE, TENSOR_RANGE = "expect_column_values_to_be_tensors", "expect_column_tensor_values_to_be_between"
RINGFLOW_EXPECTATIONS = (TENSOR_SHAPE, TENSOR_RANGE)
# Map expectations that compare rows with other rows: per batch they would miss what spans batches.
NOT_ROW_LOCAL = ("expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique",
                 "expect_multicolumn_values_to_be_unique", "expect_column_values_to_be_increasing",
                 "expect_column_values_to_be_decreasing")
EXPECTATIONS_URL = "https://greatexpectations.io/expectations/"


class SuiteError(ValueError):
    """The suite itself is malformed; the message says which expectation to fix."""


class DataValidationError(AirflowException):
    """The dataset failed its suite. `summary` holds the structured result, `str()` the readable one."""

    def __init__(self, message: str, summary: "ValidationSummary") -> None:
        super().__init__(message)
        self.summary = summary


# -- suites --------------------------------------------------------------------------------------

def load_suite(spec: Sequence[Mapping] | Mapping | str | os.PathLike, base_dir: str | None = None,
               name: str = "ringflow-suite") -> dict[str, Any]:
    """A suite in its JSON-file form from: a list of expectation configs, a `{"name", "expectations"}`
    dict, or the path of such a JSON file (relative paths from `base_dir`, the DAG's folder)."""
    if isinstance(spec, (str, os.PathLike)):
        path = pathlib.Path(spec)
        if not path.is_absolute() and base_dir:
            path = pathlib.Path(base_dir) / path
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise SuiteError(f"suite file {str(path)!r} does not exist; put it next to the DAG file or pass "
                             f"an absolute path") from exc
        except json.JSONDecodeError as exc:
            raise SuiteError(f"suite file {str(path)!r} is not valid JSON ({exc})") from exc
        if isinstance(doc, dict):
            doc.setdefault("name", path.stem)
        spec = doc
    if isinstance(spec, Mapping):
        if "expectations" not in spec:
            raise SuiteError('a suite dict needs an "expectations" list: {"name": ..., "expectations": [...]}')
        name, exps = str(spec.get("name") or name), spec["expectations"]
    else:
        exps = spec
    if isinstance(exps, (str, bytes)) or not isinstance(exps, Sequence) or not exps:
        raise SuiteError("the suite has no expectations; give a non-empty list of "
                         '{"type": "expect_...", "kwargs": {...}} dicts')
    for i, e in enumerate(exps):
        if not isinstance(e, Mapping) or not isinstance(e.get("type"), str) or not isinstance(e.get("kwargs", {}), Mapping):
            raise SuiteError(f"expectation #{i} of suite {name!r} is {e!r}; write it as "
                             f'{{"type": "expect_...", "kwargs": {{...}}}}')
    return {"name": name, "expectations": [{"type": e["type"], "kwargs": dict(e.get("kwargs", {})),
                                            **({"meta": e["meta"]} if "meta" in e else {})} for e in exps]}


def _build_suite(gx: Any, suite: Mapping[str, Any]) -> Any:
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    built = []
    for i, e in enumerate(suite["expectations"]):
        if e["type"] in RINGFLOW_EXPECTATIONS:
            _check_ringflow_expectation(i, suite["name"], e)
            continue
        try:
            built.append(ExpectationConfiguration(type=e["type"], kwargs=e["kwargs"], meta=e.get("meta")).to_domain_obj())
        except Exception as exc:  # unknown type (ExpectationNotFoundError) or bad kwargs (pydantic)
            raise SuiteError(
                f"expectation #{i} of suite {suite['name']!r} ({e['type']}, kwargs {e['kwargs']}) is invalid: "
                f"{str(exc).strip()}. Check its name and arguments at {EXPECTATIONS_URL}"
            ) from exc
    return gx.ExpectationSuite(name=suite["name"], expectations=built)


def _check_ringflow_expectation(i: int, name: str, e: Mapping[str, Any]) -> None:
    kwargs = e["kwargs"]
    needs = {TENSOR_SHAPE: ("column", "shape"), TENSOR_RANGE: ("column",)}[e["type"]]
    missing = [k for k in needs if k not in kwargs]
    if missing or (e["type"] == TENSOR_SHAPE and not isinstance(kwargs.get("shape"), Sequence)):
        raise SuiteError(f"expectation #{i} of suite {name!r} ({e['type']}, kwargs {dict(kwargs)}) needs "
                         f"{list(needs)}; e.g. {{\"column\": \"image\", \"shape\": [1, 8, 8], \"dtype\": \"float32\"}}")


def _context() -> tuple[Any, Any]:
    """An ephemeral (in-memory, nothing written) GX context and a pandas batch definition in it."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (DataContextConfig, InMemoryStoreBackendDefaults,
                                                            ProgressBarsConfig)

    # GX logs its setup at INFO ("Loading 'datasources'..."): noise in every task log.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    # No analytics (workers may have no internet and must not phone home), no progress bars in task logs.
    config = DataContextConfig(analytics_enabled=False,
                               progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
                               store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False))
    context = gx.get_context(mode="ephemeral", project_config=config)
    batch_definition = (context.data_sources.add_pandas(name="ringflow")
                        .add_dataframe_asset(name="dataset")
                        .add_batch_definition_whole_dataframe("whole"))
    return context, batch_definition


_RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": MAX_EXAMPLES}


def run_suite(df: pd.DataFrame, suite: Mapping[str, Any]) -> Any:
    """Validate one in-memory DataFrame with Great Expectations (GX expectations only). Returns GX's
    ExpectationSuiteValidationResult; validate_dataset is the streaming path the operator takes."""
    import great_expectations as gx

    context, batch_definition = _context()
    gx_suite = context.suites.add(_build_suite(gx, suite))
    return batch_definition.get_batch(batch_parameters={"dataframe": df}).validate(gx_suite, result_format=_RESULT_FORMAT)


# -- summaries -----------------------------------------------------------------------------------

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


def _plain(value: Any) -> Any:
    """Examples as readable JSON-able values: NaN shows as null, numpy scalars as Python ones."""
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


@dataclasses.dataclass
class _Outcome:
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


def _key(expectation: str, kwargs: Mapping[str, Any]) -> str:
    return json.dumps([expectation, {k: v for k, v in kwargs.items() if k != "batch_id"}], sort_keys=True,
                      default=str)


def _add_gx_results(outcomes: dict[str, _Outcome], result: Any) -> None:
    for r in result.results:
        config, details, exc = r.expectation_config, r.result or {}, r.exception_info or {}
        kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
        # exception_info is either one dict or a dict of them keyed by metric.
        errors = [exc] if "raised_exception" in exc else list(exc.values())
        error = next((e.get("exception_message") for e in errors if isinstance(e, dict) and e.get("raised_exception")), None)
        outcome = outcomes.setdefault(_key(config.type, kwargs), _Outcome(config.type, kwargs))
        outcome.add(bool(r.success), details, error)


def summarize(result: Any, suite_name: str, df: pd.DataFrame, target: str | None = None,
              features: Sequence[str] | None = None) -> ValidationSummary:
    """GX's result on one in-memory DataFrame as a ValidationSummary. With `target`, the feature and target
    columns (as sharding picks them: `features`, else every other column) are also checked to hold finite
    numbers (input_gate)."""
    from ringflow.training.core.input_gate import find_problems

    outcomes: dict[str, _Outcome] = {}
    _add_gx_results(outcomes, result)
    failures = _failures(outcomes, {}, 0)
    untrainable = tuple(find_problems(df, target, features)) if target is not None else ()
    return ValidationSummary(suite=suite_name, rows=len(df), columns=len(df.columns),
                             evaluated=len(result.results), failures=failures, untrainable=untrainable)


def _failures(outcomes: Mapping[str, _Outcome], scope_of: Mapping[str, str], sample_rows: int) -> list[Failure]:
    failures = [o.failure(scope_of.get(o.expectation, EVERY_ROW), sample_rows)
                for o in outcomes.values() if not o.passed()]
    failures.sort(key=lambda f: (f.expectation, json.dumps(f.kwargs, sort_keys=True, default=str)))
    return failures


# -- streaming validation ------------------------------------------------------------------------

def expectation_scope(expectation_type: str) -> str:
    """What an expectation is checked on when the data streams: EVERY_ROW, SCHEMA, ROW_COUNT or SAMPLE."""
    if expectation_type in RINGFLOW_EXPECTATIONS:
        return SCHEMA if expectation_type == TENSOR_SHAPE else EVERY_ROW
    if expectation_type in ROW_COUNT_EXPECTATIONS:
        return ROW_COUNT
    if expectation_type in NOT_ROW_LOCAL:
        return SAMPLE
    from great_expectations.expectations.expectation import (
        BatchExpectation, ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)
    from great_expectations.expectations.registry import get_expectation_impl

    impl = get_expectation_impl(expectation_type)
    if issubclass(impl, (ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)):
        return EVERY_ROW
    if issubclass(impl, BatchExpectation) and (expectation_type == "expect_column_to_exist"
                                               or expectation_type.startswith("expect_table_column")):
        return SCHEMA
    return SAMPLE


def _row_count_passes(expectation_type: str, kwargs: Mapping[str, Any], rows: int) -> bool:
    """GX's row-count expectations, on the exact count (their kwargs as GX documents them)."""
    if expectation_type == "expect_table_row_count_to_equal":
        return rows == kwargs["value"]
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if low is not None and (rows <= low if kwargs.get("strict_min") else rows < low):
        return False
    return high is None or (rows < high if kwargs.get("strict_max") else rows <= high)


def _tensor_outcome(outcome: _Outcome, batch: Any, offset: int) -> None:
    """ringflow's tensor expectations on one Arrow record batch."""
    from ringflow.training.formats.datasets import column_shape, tensor_matrix

    kwargs, column = outcome.kwargs, outcome.kwargs["column"]
    if column not in batch.schema.names:
        outcome.add(False, {}, f"column {column!r} is not in the dataset; columns are {batch.schema.names}")
        return
    shape, element = column_shape(batch.schema.field(column).type)
    if outcome.expectation == TENSOR_SHAPE:
        try:
            dtype = np.dtype(element.to_pandas_dtype()).name  # numpy's names, as in the manifest: float32
        except (NotImplementedError, TypeError):
            dtype = str(element)
        want_dtype = kwargs.get("dtype")
        ok = list(shape) == list(kwargs["shape"]) and (want_dtype is None or dtype == want_dtype)
        outcome.add(ok, {"observed_value": {"shape": list(shape), "dtype": dtype}}, None)
        return
    values, row_null = tensor_matrix(batch.column(column), np.float64)
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    with np.errstate(invalid="ignore"):
        bad = np.zeros(values.shape, dtype=bool)
        if low is not None:
            bad |= values < low
        if high is not None:
            bad |= values > high
    bad_rows = np.flatnonzero(bad.any(axis=1) & ~row_null)
    first = np.argmax(bad[bad_rows], axis=1) if len(bad_rows) else []
    outcome.add(not len(bad_rows), {
        "unexpected_count": len(bad_rows), "element_count": len(values), "missing_count": int(row_null.sum()),
        "partial_unexpected_list": [values[r, c] for r, c in zip(bad_rows[:MAX_EXAMPLES], first[:MAX_EXAMPLES])],
        "partial_unexpected_index_list": [offset + int(r) for r in bad_rows[:MAX_EXAMPLES]]}, None)


def expectation_columns(expectation: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The columns an expectation reads (`column`, `column_A`, `column_B`, `column_list`), or None when it may
    read any: a table-level one takes the whole table, and a `row_condition` names columns in its own syntax."""
    kwargs = expectation["kwargs"]
    if kwargs.get("row_condition"):
        return None
    named = [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs]
    named += list(kwargs.get("column_list") or ())
    return tuple(named) or None


def _empty_table(schema: Any) -> Any:
    """A table of `schema` with no rows (Schema.empty_table cannot make a fixed_shape_tensor column)."""
    import pyarrow as pa

    arrays = [pa.ExtensionArray.from_storage(f.type, pa.array([], f.type.storage_type))
              if isinstance(f.type, pa.BaseExtensionType) else pa.array([], f.type) for f in schema]
    return pa.table(arrays, schema=schema)


def validate_dataset(dataset: Any, suite: Mapping[str, Any], target: str | None = None,
                     features: Sequence[str] | None = None, batch_rows: int | None = None) -> ValidationSummary:
    """Run `suite` (load_suite's form) over a datasets.Dataset, a batch at a time (see the module docstring
    for which expectations see every row). With `target`, the input gate streams along.

    Only the columns something checks are read, one column group per pass (datasets.Dataset.column_groups:
    a wide Parquet table in several), and each expectation is given only the columns it names."""
    import great_expectations as gx
    import pyarrow as pa

    from ringflow.training.formats.datasets import as_dataset, row_bytes
    from ringflow.training.core.input_gate import InputGate, feature_columns
    from ringflow.training.core.sharding import shuffled_positions

    dataset = as_dataset(dataset)
    exps = suite["expectations"]
    _build_suite(gx, suite)  # every expectation is checked (and a bad one named) before any data is read
    scope_of = {e["type"]: expectation_scope(e["type"]) for e in exps}
    by_scope = {scope: [e for e in exps if scope_of[e["type"]] == scope] for scope in (EVERY_ROW, SCHEMA, ROW_COUNT, SAMPLE)}
    context, batch_definition = _context()

    def gx_suite(name: str, entries: list) -> Any:
        gx_entries = [e for e in entries if e["type"] not in RINGFLOW_EXPECTATIONS]
        return context.suites.add(_build_suite(gx, {"name": f"{suite['name']}/{name}", "expectations": gx_entries})) \
            if gx_entries else None

    outcomes: dict[str, _Outcome] = {}
    for e in exps:  # in suite order, so a report lists them as written
        outcomes.setdefault(_key(e["type"], e["kwargs"]), _Outcome(e["type"], dict(e["kwargs"])))

    def run(gx_suite_: Any, frame: pd.DataFrame) -> None:
        if gx_suite_ is not None:
            _add_gx_results(outcomes, batch_definition.get_batch(batch_parameters={"dataframe": frame})
                            .validate(gx_suite_, result_format=_RESULT_FORMAT))

    columns, rows = dataset.columns, dataset.num_rows
    everything = tuple(columns)

    def reads(e: Mapping[str, Any]) -> tuple[str, ...]:
        return expectation_columns(e) or everything

    # An expectation naming a column the dataset lacks cannot pass: it runs once, on the schema, for its error;
    # so does every GX one when there are no rows (GX still checks the columns).
    streamed = [e for e in by_scope[EVERY_ROW] if all(c in columns for c in reads(e))]
    on_schema = by_scope[SCHEMA] + [e for e in by_scope[EVERY_ROW] if e not in streamed
                                    or (not rows and e["type"] not in RINGFLOW_EXPECTATIONS)]
    sample_suite = gx_suite("sample", by_scope[SAMPLE])
    sample_size = min(SAMPLE_ROWS, max(1, SAMPLE_BYTES // row_bytes(dataset.schema))) if sample_suite else 0
    sampled = {c for e in by_scope[SAMPLE] for c in reads(e)} if sample_size else set()
    gated = set(feature_columns(columns, target, features)) | {target} if target is not None else set()
    read = [c for c in columns if c in gated or c in sampled or any(c in reads(e) for e in streamed)]
    groups = dataset.column_groups(read, together=[reads(e) for e in streamed
                                                   if e["type"] not in RINGFLOW_EXPECTATIONS])

    empty = _empty_table(dataset.schema)
    run(gx_suite("schema", [e for e in on_schema if e["type"] not in RINGFLOW_EXPECTATIONS]), empty.to_pandas())
    for e in on_schema:
        if e["type"] in RINGFLOW_EXPECTATIONS:
            _tensor_outcome(outcomes[_key(e["type"], e["kwargs"])], empty, 0)
    gate = InputGate(columns, target, features) if target is not None else None
    sample_parts: list[pa.Table] = []
    for g, names in enumerate(groups if rows else []):
        mine = [e for e in streamed if reads(e)[0] in names]  # `together` put all of an expectation's columns here
        stream_suite = gx_suite(f"stream-{g}", mine)
        gx_columns = [c for c in names if any(c in reads(e) for e in mine if e["type"] not in RINGFLOW_EXPECTATIONS)]
        tensors = [e for e in mine if e["type"] in RINGFLOW_EXPECTATIONS]
        sample_columns = [c for c in names if c in sampled]
        kept: list[pa.RecordBatch] = []
        offset = 0
        for batch in dataset.batches(names, batch_rows=batch_rows):
            if stream_suite is not None:
                frame = batch.select(gx_columns).to_pandas()
                frame.index = pd.RangeIndex(offset, offset + batch.num_rows)  # examples name rows of the whole table
                run(stream_suite, frame)
            for e in tensors:
                _tensor_outcome(outcomes[_key(e["type"], e["kwargs"])], batch, offset)
            if gate is not None:
                gate.add(batch)
            if sample_columns:  # the rows whose place in the seeded permutation is among the first sample_size
                keep = shuffled_positions(np.arange(offset, offset + batch.num_rows), rows, _SAMPLE_SEED) < sample_size
                kept.append(batch.select(sample_columns).filter(keep))
            offset += batch.num_rows
        if sample_columns:
            schema = pa.schema([dataset.schema.field(c) for c in sample_columns])
            sample_parts.append(pa.Table.from_batches(kept, schema=schema))
    # The row count is exact, and judged here: GX would build per-row structures even for an empty frame.
    for e in by_scope[ROW_COUNT]:
        outcomes[_key(e["type"], e["kwargs"])].add(_row_count_passes(e["type"], e["kwargs"], rows),
                                                   {"observed_value": rows}, None)
    if sample_suite is not None:  # every group kept the same rows, in order: their columns side by side
        parts = {name: part.column(name) for part in sample_parts for name in part.column_names}
        fields = [dataset.schema.field(c) for c in columns if c in parts]
        table = pa.table([parts[f.name] for f in fields], schema=pa.schema(fields)) if parts else empty
        run(sample_suite, table.to_pandas())
    untrainable = tuple(gate.problems()) if gate is not None else ()
    sample_rows = min(sample_size, rows)
    return ValidationSummary(suite=suite["name"], rows=rows, columns=len(dataset.columns), evaluated=len(exps),
                             failures=_failures(outcomes, scope_of, sample_rows), untrainable=untrainable,
                             scopes={scope: tuple(e["type"] for e in entries) for scope, entries in by_scope.items()},
                             sample_rows=sample_rows)


# -- the operator --------------------------------------------------------------------------------

class ValidateDatasetOperator(BaseOperator):
    """Fail the task with an actionable summary if `dataset_uri` breaks the suite, or if its feature and
    target columns hold anything but finite numbers (checked whatever the suite says: training cannot use
    it); write nothing. The dataset streams through (see validate_dataset): memory does not grow with it.

    suite: a list of expectation configs, a `{"name", "expectations"}` dict, or the path of a JSON
    file with that dict (relative to the DAG file's folder).
    target: the target column; every other column (or `features`, when given) is a feature, as in sharding.
    Returns (XCom) `{"dataset", "rows", "columns", "suite", "expectations", "sampled", "sample_rows"}`:
    `sampled` lists the expectations checked on a sample rather than on every row.
    """

    template_fields: Sequence[str] = ("dataset_uri", "conn_id", "target")

    def __init__(self, *, dataset_uri: str, suite: Sequence[Mapping] | Mapping | str | os.PathLike,
                 conn_id: str | None = DEFAULT_S3_CONN_ID, target: str = "target",
                 features: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dataset_uri = dataset_uri
        self.suite = suite
        self.conn_id = conn_id
        self.target, self.features = target, features

    def _dag_folder(self) -> str | None:
        fileloc = getattr(self.dag, "fileloc", None) if self.has_dag() else None
        return os.path.dirname(fileloc) if fileloc else None

    def execute(self, context: Any) -> dict[str, Any]:
        from ringflow.training.formats.datasets import open_dataset

        suite = load_suite(self.suite, base_dir=self._dag_folder())
        # Through the connection, not the environment: in a task S3 settings come from Airflow.
        with open_dataset(self.dataset_uri, lambda parent: open_store_for(parent, self.conn_id)) as dataset:
            self.log.info("validating %s (%d rows, %d columns, streamed) with suite %r (%d expectations)",
                          self.dataset_uri, dataset.num_rows, len(dataset.columns), suite["name"],
                          len(suite["expectations"]))
            summary = validate_dataset(dataset, suite, target=self.target, features=self.features)
        sampled = list(summary.scopes.get(SAMPLE, ()))
        if sampled:
            self.log.info("checked on a sample of %d rows: %s; every other expectation saw every row",
                          summary.sample_rows, sampled)
        if not summary.success:
            message = summary.message(self.dataset_uri)
            self.log.error("%s", message)
            raise DataValidationError(message, summary)
        self.log.info("all %d expectations of suite %r passed", summary.evaluated, summary.suite)
        return {"dataset": self.dataset_uri, "rows": summary.rows, "columns": summary.columns,
                "suite": summary.suite, "expectations": summary.evaluated, "sampled": sampled,
                "sample_rows": summary.sample_rows}
