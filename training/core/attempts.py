"""What comes after a try of a training job: the next try as it was, changed by a remedy, after a wait, or
none (the job succeeded, or it fails). One pure function, `next_try`, over the ended try's Observation, the
failure policy's Decision on it, the config it ran with, the remedies planned so far, the try's number and how
many tries there may be. Table-tested (tests/training/core/test_attempts.py).

The train operator's execute_complete asks it and only logs, stops the job when the decision says so, records
the planned remedy, and raises (a retry or a failure without one); `ringflow train --retries` (local_retries.py) asks
it after each try and relaunches. Under `remediation: "auto"` the remediation policy (remediation.py) answers
the verdict that ended the try, and failure_policy.remediated turns the decision.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from ..formats.config import REMEDIATION_AUTO, JobConfig
from .choices import Choice
from .failure_policy import Action, Decision, Observation, remediated
from .remediation import PlannedRemedy, Remedy, RemedyAction, remedy, taken_before


class Next(Choice):
    """What comes after a try."""

    RETRY = "retry"                      # the next try as this one was, from the last checkpoint
    RETRY_CHANGED = "retry_changed"      # the next try with a remedy's change (record `planned` first)
    WAIT_THEN_RETRY = "wait_then_retry"  # the same, after the remedy's wait (a store outage)
    SUCCEED = "succeed"                  # no next try: the job succeeded
    FAIL = "fail"                        # no next try: it would meet the same failure, or no try is left


RETRIES = frozenset({Next.RETRY, Next.RETRY_CHANGED, Next.WAIT_THEN_RETRY})


@dataclasses.dataclass(frozen=True)
class NextTry:
    """What comes after a try (`action`), on the failure policy's `decision` (its verdict, exit code and
    whether to stop the job). said: what this adds to the decision's reason (the remedy's words, or that no
    try is left). planned: the remedy to record for the next try (RETRY_CHANGED, WAIT_THEN_RETRY). remedy:
    the remediation policy's answer, when it was asked."""

    action: Next
    decision: Decision
    said: str = ""
    planned: PlannedRemedy | None = None
    remedy: Remedy | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", Next.of(self.action, "next try"))
        if (self.planned is not None) != (self.action in (Next.RETRY_CHANGED, Next.WAIT_THEN_RETRY)):
            raise ValueError(f"next try {self.action.value!r} with planned remedy {self.planned!r}: a changed "
                             "retry records the remedy it runs with, any other none")

    @property
    def reason(self) -> str:
        return self.decision.reason + self.said

    @property
    def retries(self) -> bool:
        return self.action in RETRIES

    @property
    def wait_seconds(self) -> float:
        return self.planned.remedy.wait_seconds if self.planned is not None else 0.0

    @property
    def gave_up(self) -> bool:
        """The remediation policy had no remedy left for the verdict (it fails saying so)."""
        return self.remedy is not None and self.remedy.action == RemedyAction.GIVE_UP


def next_try(seen: Observation, decision: Decision, config: JobConfig | None, planned: Sequence[PlannedRemedy],
             try_number: int, tries: int | None, *, backend_kind: str, num_workers: int,
             rank_nodes: Mapping[int, str] | None = None) -> NextTry:
    """After try `try_number` ended as `seen`, on which the failure policy decided `decision`. config: the
    config that try ran with; None when it is not known for sure (the run folder could not be read): nothing
    is remediated. planned: the remedies planned so far (remedies.jsonl). tries: how many tries there may be
    (None: as many as whoever retries allows; the operator's Airflow retries). backend_kind, num_workers,
    rank_nodes: where the try ran (the workers asked for, when the try wrote no result to say its own)."""
    if not decision.decided:
        raise ValueError(f"nothing to decide after try {try_number} yet: {decision.reason} (the job runs on)")
    if decision.action == Action.SUCCEED:
        return NextTry(Next.SUCCEED, decision)
    found = _remedy(seen, decision, config, planned, try_number, backend_kind=backend_kind,
                    num_workers=num_workers, rank_nodes=rank_nodes)
    outcome = remediated(decision, found) if found is not None else decision
    said = outcome.reason.removeprefix(decision.reason)
    if outcome.action == Action.FAIL:
        return NextTry(Next.FAIL, decision, said, remedy=found)
    if tries is not None and try_number >= tries:
        return NextTry(Next.FAIL, decision, f"; no try left (try {try_number} of {tries})", remedy=found)
    if found is not None and found.changes:
        action = Next.WAIT_THEN_RETRY if found.wait_seconds > 0 else Next.RETRY_CHANGED
        return NextTry(action, decision, said, PlannedRemedy(try_number + 1, found), found)
    return NextTry(Next.RETRY, decision, said, remedy=found)


def _remedy(seen: Observation, decision: Decision, config: JobConfig | None, planned: Sequence[PlannedRemedy],
            try_number: int, *, backend_kind: str, num_workers: int,
            rank_nodes: Mapping[int, str] | None) -> Remedy | None:
    """The remediation policy's answer to the verdict that ended the try; None when it is not asked: no
    verdict, the config not known, remediation off, or a verdict that did not end the try (a DEGRADED seen
    before a crash or a timeout is not what failed: remedying it would change a job for what did not stop it)."""
    verdict = decision.verdict
    if decision.action not in (Action.RETRY, Action.FAIL) or verdict is None or config is None:
        return None
    if not verdict.is_fatal(config.health.stop_on_degraded) or config.remediation != REMEDIATION_AUTO:
        return None
    history = [p.remedy for p in taken_before(planned, try_number)]
    world_size = seen.own_result.world_size if seen.own_result is not None else num_workers
    return remedy(verdict, config, history, world_size=world_size, backend_kind=backend_kind, rank_nodes=rank_nodes)

