"""What promote reads from a run folder before it decides: the run's published result and its evaluation.

A run that did not succeed, or files that are missing or unreadable, are RunNotReady: there is nothing sound
to decide on, and the message says which step to (re)run. The Airflow operators turn it into an
AirflowException; `ringflow promote` prints it on one line.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from ringflow.training.formats.eval_result import EvalResult, EvalResultError, read_eval
from ringflow.training.run_layout import EVAL
from ringflow.training.run_result import ResultError, RunResult, read_result
from ringflow.training.store.base import ObjectStore


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


def read_run_result(run_folder: ObjectStore) -> RunResult:
    """The run's published result (run_folder.py: the current attempt's); RunNotReady when the train step
    left none, or a broken one."""
    try:
        result = read_result(run_folder)
    except ResultError as exc:
        raise RunNotReady(str(exc)) from exc
    if result is None:
        raise RunNotReady(f"{run_folder.uri.rstrip('/')}/result.json does not exist (no attempt published one): the "
                          f"train task did not finish this run")
    return result


def read_evaluated_run(run_folder: ObjectStore, run_uri: str) -> EvaluatedRun:
    """The result and evaluation of a run that may be promoted, or RunNotReady saying why it may not:
    training did not succeed, or the evaluate step did not run."""
    result = read_run_result(run_folder)
    if not result.succeeded:
        raise RunNotReady(
            f"run {run_uri} has status {result.status!r} (attempt {result.attempt}, verdict "
            f"{result.verdict.status if result.verdict else None}): only a succeeded run with a checkpoint "
            "can be promoted"
        )
    try:
        evaluation = read_eval(run_folder)
    except EvalResultError as exc:
        raise RunNotReady(str(exc)) from exc
    if evaluation is None:
        raise RunNotReady(f"{run_folder.uri.rstrip('/')}/{EVAL} does not exist: the evaluate task did not run "
                          f"(ringflow evaluate {run_uri})")
    return EvaluatedRun(run_uri, result, evaluation)
