"""Check a dataset against a Great Expectations suite before anything is sharded or trained.

A suite is plain data, so it can live in the DAG file or in a JSON file next to it:

    {"name": "digits", "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "target"}}, ...]}

The pure part (load_suite, default_suite, run_suite, summarize) needs no Airflow and is tested on
DataFrames; `ValidateDatasetOperator` only reads the dataset and raises with the summary.
Great Expectations is imported inside the functions: it takes seconds to import, and DAG files
importing this module are parsed over and over by the scheduler.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
from typing import Any, Mapping, Sequence

import pandas as pd
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ringflow.operators.connections import DEFAULT_CONN_ID, open_store_for

# Numeric dtypes a feature column may have (numpy names, plus pandas' nullable ones).
NUMERIC_TYPES = [f"int{b}" for b in (8, 16, 32, 64)] + [f"uint{b}" for b in (8, 16, 32, 64)] + [
    "float16", "float32", "float64", "Int8Dtype", "Int16Dtype", "Int32Dtype", "Int64Dtype",
    "Float32Dtype", "Float64Dtype"]
MAX_EXAMPLES = 5
EXPECTATIONS_URL = "https://greatexpectations.io/expectations/"


class SuiteError(ValueError):
    """The suite itself is malformed; the message says which expectation to fix."""


class DataValidationError(AirflowException):
    """The dataset failed its suite. `summary` holds the structured result, `str()` the readable one."""

    def __init__(self, message: str, summary: "ValidationSummary") -> None:
        super().__init__(message)
        self.summary = summary


# -- suites --------------------------------------------------------------------------------------

def default_suite(target: str, features: Sequence[str], *, target_values: Sequence[Any] | None = None,
                  target_range: tuple[float | None, float | None] | None = None,
                  feature_range: tuple[float | None, float | None] | Mapping[str, tuple] | None = None,
                  name: str = "ringflow-default") -> dict[str, Any]:
    """The checks every training dataset needs: rows present, no nulls, numeric features (within
    `feature_range`: one (min, max) for all, or per feature), and a target in `target_values` or
    `target_range`. Returns the JSON-file form, `{"name": ..., "expectations": [...]}`."""
    def exp(type_: str, **kwargs: Any) -> dict[str, Any]:
        return {"type": type_, "kwargs": kwargs}

    exps = [exp("expect_table_row_count_to_be_between", min_value=1)]
    for column in [target, *features]:
        exps.append(exp("expect_column_to_exist", column=column))
        exps.append(exp("expect_column_values_to_not_be_null", column=column))
    if target_values is not None:
        exps.append(exp("expect_column_values_to_be_in_set", column=target, value_set=list(target_values)))
    if target_range is not None:
        exps.append(exp("expect_column_values_to_be_between", column=target,
                        min_value=target_range[0], max_value=target_range[1]))
    for column in features:
        exps.append(exp("expect_column_values_to_be_in_type_list", column=column, type_list=NUMERIC_TYPES))
        bounds = feature_range.get(column) if isinstance(feature_range, Mapping) else feature_range
        if bounds is not None:
            exps.append(exp("expect_column_values_to_be_between", column=column,
                            min_value=bounds[0], max_value=bounds[1]))
    return {"name": name, "expectations": exps}


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
        try:
            built.append(ExpectationConfiguration(type=e["type"], kwargs=e["kwargs"], meta=e.get("meta")).to_domain_obj())
        except Exception as exc:  # unknown type (ExpectationNotFoundError) or bad kwargs (pydantic)
            raise SuiteError(
                f"expectation #{i} of suite {suite['name']!r} ({e['type']}, kwargs {e['kwargs']}) is invalid: "
                f"{str(exc).strip()}. Check its name and arguments at {EXPECTATIONS_URL}"
            ) from exc
    return gx.ExpectationSuite(name=suite["name"], expectations=built)


def run_suite(df: pd.DataFrame, suite: Mapping[str, Any]) -> Any:
    """Validate `df` with Great Expectations in an ephemeral (in-memory, nothing written) context.
    Returns GX's ExpectationSuiteValidationResult."""
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
    gx_suite = context.suites.add(_build_suite(gx, suite))
    batch = batch_definition.get_batch(batch_parameters={"dataframe": df})
    return batch.validate(gx_suite, result_format={"result_format": "SUMMARY",
                                                   "partial_unexpected_count": MAX_EXAMPLES})


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

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if k != "type_list")
        head = f"{self.expectation}({args})"
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

    @property
    def success(self) -> bool:
        return not self.failures

    def message(self, dataset: str) -> str:
        lines = [f"dataset {dataset} ({self.rows} rows, {self.columns} columns) failed "
                 f"{len(self.failures)} of {self.evaluated} expectations of suite {self.suite!r}:"]
        lines += [f"  - {f.describe()}" for f in self.failures]
        lines.append("Fix the data at its source (or the expectation, if it is the one that is wrong) "
                     "and clear this task to rerun it.")
        return "\n".join(lines)


def _plain(value: Any) -> Any:
    """Examples as readable JSON-able values: NaN shows as null, numpy scalars as Python ones."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def summarize(result: Any, suite_name: str, df: pd.DataFrame) -> ValidationSummary:
    failures = []
    for r in result.results:
        if r.success:
            continue
        config, details, exc = r.expectation_config, r.result or {}, r.exception_info or {}
        # exception_info is either one dict or a dict of them keyed by metric.
        errors = [exc] if "raised_exception" in exc else list(exc.values())
        error = next((e.get("exception_message") for e in errors if isinstance(e, dict) and e.get("raised_exception")), None)
        failures.append(Failure(
            expectation=config.type,
            kwargs={k: v for k, v in config.kwargs.items() if k != "batch_id"},
            unexpected_count=details.get("unexpected_count"),
            unexpected_percent=details.get("unexpected_percent"),
            examples=[_plain(v) for v in details.get("partial_unexpected_list", [])[:MAX_EXAMPLES]],
            example_rows=[_plain(v) for v in details.get("partial_unexpected_index_list", [])[:MAX_EXAMPLES]],
            observed=_plain(details.get("observed_value")),
            error=error,
        ))
    failures.sort(key=lambda f: (f.expectation, json.dumps(f.kwargs, sort_keys=True, default=str)))
    return ValidationSummary(suite=suite_name, rows=len(df), columns=len(df.columns),
                             evaluated=len(result.results), failures=failures)


# -- the operator --------------------------------------------------------------------------------

def read_dataset(uri: str, conn_id: str | None = DEFAULT_CONN_ID) -> pd.DataFrame:
    """`builtin:<name>`, or a .parquet/.csv file by path, file:// or s3:// URI (S3 through `conn_id`)."""
    from ringflow.training.datasets import check_table_name, parse_table, read_table
    from ringflow.training.store import split_uri

    if uri.startswith("builtin:"):
        return read_table(uri)
    # Through the connection, not read_table's environment: in a task S3 settings come from Airflow.
    check_table_name(uri)
    parent, name = split_uri(uri)
    return parse_table(name, open_store_for(parent, conn_id).get_bytes(name))


class ValidateDatasetOperator(BaseOperator):
    """Fail the task with an actionable summary if `dataset_uri` breaks the suite; write nothing.

    suite: a list of expectation configs, a `{"name", "expectations"}` dict, or the path of a JSON
    file with that dict (relative to the DAG file's folder).
    Returns (XCom) `{"dataset", "rows", "columns", "suite", "expectations"}`.
    """

    template_fields: Sequence[str] = ("dataset_uri", "conn_id")

    def __init__(self, *, dataset_uri: str, suite: Sequence[Mapping] | Mapping | str | os.PathLike,
                 conn_id: str | None = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dataset_uri = dataset_uri
        self.suite = suite
        self.conn_id = conn_id

    def _dag_folder(self) -> str | None:
        fileloc = getattr(self.dag, "fileloc", None) if self.has_dag() else None
        return os.path.dirname(fileloc) if fileloc else None

    def execute(self, context: Any) -> dict[str, Any]:
        suite = load_suite(self.suite, base_dir=self._dag_folder())
        df = read_dataset(self.dataset_uri, self.conn_id)
        self.log.info("validating %s (%d rows, %d columns) with suite %r (%d expectations)",
                      self.dataset_uri, len(df), len(df.columns), suite["name"], len(suite["expectations"]))
        summary = summarize(run_suite(df, suite), suite["name"], df)
        if not summary.success:
            message = summary.message(self.dataset_uri)
            self.log.error("%s", message)
            raise DataValidationError(message, summary)
        self.log.info("all %d expectations of suite %r passed", summary.evaluated, summary.suite)
        return {"dataset": self.dataset_uri, "rows": summary.rows, "columns": summary.columns,
                "suite": summary.suite, "expectations": summary.evaluated}
