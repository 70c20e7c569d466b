"""What promote reads from a run folder before it decides: the run's published result and its evaluation.

A run that did not succeed, or files that are missing or unreadable, are RunNotReady: there is nothing sound
to decide on, and the message says which step to (re)run. The Airflow operators turn it into an
AirflowException; `ringflow promote` prints it on one line.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from .registry.model_registry import run_key_in
from ..formats.eval_result import EvalResult, EvalResultError
from ..formats.run_folder import RunFolder
from ..formats.run_result import ResultError, RunResult
from ..store.base import ObjectStore


class RunNotReady(ValueError):
    """The run cannot be promoted as it is: not trained, not succeeded, not evaluated, or unreadable."""


@dataclasses.dataclass(frozen=True)
class EvaluatedRun:
    """A succeeded run with its evaluation: what may be promoted."""

    uri: str
    result: RunResult
    evaluation: EvalResult

    @property
    def metrics(self) -> Mapping[str, float]:
        return self.evaluation.metrics

    @property
    def verdict(self) -> str | None:
        return self.result.verdict.status if self.result.verdict else None


def run_folder_in(store: ObjectStore, store_uri: str, run_uri: str) -> RunFolder:
    """The run folder `run_uri` inside the registry's store (opened once, with its settings): the registry
    copies a checkpoint server-side, so the run must be inside it (run_key_in refuses one that is not)."""
    return RunFolder(store.child(run_key_in(store_uri, run_uri)), uri=run_uri)


def read_run_result(run: RunFolder) -> RunResult:
    """The run's published result (the current attempt's); RunNotReady when the train step left none, or a
    broken one."""
    try:
        result = run.read_result()
    except ResultError as exc:
        raise RunNotReady(str(exc)) from exc
    if result is None:
        raise RunNotReady(f"{run.uri_of('result.json')} does not exist (no attempt published one): the train task "
                          f"did not finish this run")
    return result


def read_evaluated_run(run: RunFolder) -> EvaluatedRun:
    """The result and evaluation of a run that may be promoted, or RunNotReady saying why it may not:
    training did not succeed, or the evaluate step did not run."""
    result = read_run_result(run)
    if not result.succeeded:
        raise RunNotReady(
            f"run {run.uri} has status {result.status!r} (attempt {result.attempt}, verdict "
            f"{result.verdict.status if result.verdict else None}): only a succeeded run with a checkpoint "
            "can be promoted"
        )
    try:
        evaluation = run.read_eval()
    except EvalResultError as exc:
        raise RunNotReady(str(exc)) from exc
    if evaluation is None:
        raise RunNotReady(f"{run.eval_uri} does not exist: the evaluate task did not run (ringflow evaluate {run.uri})")
    return EvaluatedRun(run.uri, result, evaluation)
