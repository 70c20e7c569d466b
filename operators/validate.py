"""Check a dataset against a Great Expectations suite before anything is sharded or trained: the Airflow
adapter of ringflow.training.core.validation (the suite's form, the streaming engine, the scopes of each
expectation: read stream.py). `ringflow validate` runs the same engine from a shell.

Nothing heavy is imported here: pandas, numpy and Great Expectations load when the task runs, not each time
the scheduler parses a DAG file that imports this module.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_store_for

if TYPE_CHECKING:
    from ringflow.training.core.validation.summary import ValidationSummary


class DataValidationError(AirflowException):
    """The dataset failed its suite. `summary` holds the structured result, `str()` the readable one."""

    def __init__(self, message: str, summary: "ValidationSummary") -> None:
        super().__init__(message)
        self.summary = summary


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
        from ringflow.training.core.validation.stream import validate_dataset
        from ringflow.training.core.validation.suite import load_suite
        from ringflow.training.formats.datasets import open_dataset

        suite = load_suite(self.suite, base_dir=self._dag_folder())
        # Through the connection, not the environment: in a task S3 settings come from Airflow.
        with open_dataset(self.dataset_uri, lambda parent: open_store_for(parent, self.conn_id)) as dataset:
            self.log.info("validating %s (%d rows, %d columns, streamed) with suite %r (%d expectations)",
                          self.dataset_uri, dataset.num_rows, len(dataset.columns), suite["name"],
                          len(suite["expectations"]))
            summary = validate_dataset(dataset, suite, target=self.target, features=self.features)
        if summary.sampled:
            self.log.info("checked on a sample of %d rows: %s; every other expectation saw every row",
                          summary.sample_rows, summary.sampled)
        if not summary.success:
            message = summary.message(self.dataset_uri)
            self.log.error("%s", message)
            raise DataValidationError(message, summary)
        self.log.info("all %d expectations of suite %r passed", summary.evaluated, summary.suite)
        return summary.report(self.dataset_uri)
