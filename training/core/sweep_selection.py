"""A sweep's selection: what each candidate left in its run folder, and which eligible one is best by the
gate's metric. select_best is pure (tested with tables); read_candidate reads result.json and eval.json.
The sweep's operator (operators/sweep.py) promotes the winner through the registry, asking the gate again."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from .gate import Gate
from ..formats.eval_result import EvalResultError
from ..formats.run_folder import RunFolder
from ..formats.run_result import ResultError


@dataclasses.dataclass(frozen=True)
class Candidate:
    """What one candidate left in its run folder. problem: why it could not be judged (no result.json, ...)."""

    index: int
    run_uri: str
    status: str | None = None
    checkpoint: str | None = None
    verdict: str | None = None
    metrics: Mapping[str, Any] | None = None
    problem: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ValueError(f"candidate index is {self.index!r}; use the map index (0, 1, ...)")
        if self.problem is None and self.status is None:
            raise ValueError(f"candidate {self.index}: give its result's status, or the problem that left none")


@dataclasses.dataclass(frozen=True)
class Selection:
    """The eligible candidate with the best metric (None: none is eligible), and why each other one lost."""

    winner: int | None
    reasons: Mapping[int, str]


def ineligible_reason(candidate: Candidate, gate: Gate) -> str | None:
    """None if the candidate may compete, else why not. Production is not asked here: the registry asks the
    gate against production when the winner is promoted."""
    if candidate.problem is not None:
        return candidate.problem
    if candidate.status != "succeeded" or not candidate.checkpoint:
        return f"training did not succeed (status {candidate.status!r}, verdict {candidate.verdict!r})"
    metrics = candidate.metrics or {}
    if gate.metric not in metrics:
        return f"eval.json has no metric {gate.metric!r} (metrics: {sorted(metrics)})"
    value = metrics[gate.metric]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isinf(value):
        return f"metric {gate.metric!r} is {value!r}, not a finite number"
    return dataclasses.replace(gate, compare_to_production=False).check(candidate.verdict, dict(metrics), None)


def select_best(candidates: Sequence[Candidate], gate: Gate) -> Selection:
    """The eligible candidate with the best gate metric (the lowest index on a tie), and a reason for each
    candidate that did not win. Pure: no I/O."""
    reasons: dict[int, str] = {}
    eligible: list[Candidate] = []
    for candidate in candidates:
        reason = ineligible_reason(candidate, gate)
        if reason is None:
            eligible.append(candidate)
        else:
            reasons[candidate.index] = reason
    if not eligible:
        return Selection(winner=None, reasons=reasons)
    sign = 1 if gate.mode == "max" else -1
    best = max(eligible, key=lambda c: (sign * c.metrics[gate.metric], -c.index))
    for candidate in eligible:
        if candidate is not best:
            reasons[candidate.index] = (f"{gate.metric} {candidate.metrics[gate.metric]:g} is not the best: candidate "
                                        f"{best.index} has {best.metrics[gate.metric]:g} ({gate.mode} is better)")
    return Selection(winner=best.index, reasons=reasons)


def read_candidate(run: RunFolder, index: int) -> Candidate:
    """One candidate from its run folder: its published result (train) and eval.json (evaluate)."""
    try:
        result = run.read_result()  # the published one (run_folder.py)
    except ResultError as exc:
        return Candidate(index, run.uri, problem=f"unreadable result.json: {exc}")
    if result is None:
        return Candidate(index, run.uri, problem="no result.json: its train task failed before the job finished "
                                                 "(see that task's log)")
    verdict = result.verdict.status if result.verdict else None
    base = dict(index=index, run_uri=run.uri, status=result.status, checkpoint=result.checkpoint, verdict=verdict)
    if not result.succeeded:
        return Candidate(**base)
    try:
        evaluation = run.read_eval()
    except EvalResultError as exc:
        return Candidate(**base, problem=f"unreadable eval.json ({exc})")
    if evaluation is None:
        return Candidate(**base, problem="no eval.json: its evaluate task did not finish (see that task's log)")
    return Candidate(**base, metrics=dict(evaluation.metrics))
