"""What one poll of a watched job counts as: the failure policy's Observation (core/failure_policy.py), from
what the trigger polled (the backend's status, the health watch's verdict, this attempt's result). Pure: the
trigger only polls, calls `observe`, and reports once the policy has something to decide.

Two facts are made here rather than read: what the backend itself saw end the job (a pod OOMKilled) is the
verdict, at rank 0's next step, since it explains the end better than the watched health; and a job that has
published a `replaying` result is timed, and counts as stuck in its replay (`replay_overdue`) past
`replay_limit_seconds`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..formats.run_result import RunResult
from ..health.oom import with_step
from ..health.verdict import Verdict
from .backends.base import JobStatus
from .failure_policy import Observation

# A replay may take health.replay_seconds on the ranks, then rank 0 waits for the other ranks' reports and
# publishes (rank/replay_exchange.py's grace, a checkpoint upload settling first): past this much more, the job
# is taken as stuck in its replay and stopped, its NONFINITE verdict standing.
REPLAY_OVERDUE_GRACE_SECONDS = 60.0


def replay_limit_seconds(health: Mapping[str, Any]) -> float:
    """How long a job that published a `replaying` result is watched before it counts as stuck."""
    from ..formats.config import HealthConfig

    return float(health.get("replay_seconds", HealthConfig.replay_seconds)) + REPLAY_OVERDUE_GRACE_SECONDS


@dataclasses.dataclass(frozen=True)
class Poll:
    """What one poll read. watched: the health watch's verdict (a dict with `fatal`), None when none.
    last_step: the last step rank 0 completed, as the watch knows it. result: this attempt's RunResult, when
    it was read (`wants_result`). at: when (seconds since the epoch)."""

    status: JobStatus
    watched: Mapping[str, Any] | None
    last_step: int | None
    result: RunResult | None
    attempt: str | None
    at: float

    def __post_init__(self) -> None:
        if not isinstance(self.status, JobStatus):
            raise ValueError(f"a poll's status is a {type(self.status).__name__}; use the backend's JobStatus")


@dataclasses.dataclass(frozen=True)
class Watching:
    """What the watch carries from one poll to the next: whether a fatal verdict was already seen without a
    result (the job was given that poll to stop itself), and since when the job replays its failed step."""

    waited: bool = False
    replaying_since: float | None = None


def wants_result(status: JobStatus, watched: Mapping[str, Any] | None) -> bool:
    """Whether this poll reads the attempt's result: only when it can matter, the job ended or it may have
    stopped on its verdict."""
    return status.finished or bool(watched and watched.get("fatal"))


def observe(poll: Poll, carried: Watching, *, timeout_at: float | None,
            health: Mapping[str, Any]) -> tuple[Observation, Watching]:
    """What `poll` counts as, and what the next poll carries. timeout_at: the task's deadline (None: none);
    health: the job's health config (its replay_seconds)."""
    verdict, fatal = Verdict.from_dict(poll.watched), bool(poll.watched and poll.watched.get("fatal"))
    if poll.status.verdict is not None:
        # What the backend saw end the job (a pod OOMKilled) explains it better than the watched health; its
        # step is rank 0's last (the ranks move in step).
        step = poll.last_step + 1 if poll.last_step is not None else None
        verdict, fatal = with_step(poll.status.verdict, step), True
    since = carried.replaying_since
    if poll.result is not None and poll.result.replaying and poll.result.attempt == poll.attempt and since is None:
        since = poll.at
    seen = Observation(poll.status.state, poll.status.exit_code, poll.status.reason, poll.result, poll.attempt,
                       verdict, fatal, carried.waited,
                       timed_out=timeout_at is not None and poll.at > timeout_at,
                       replay_overdue=since is not None and poll.at - since > replay_limit_seconds(health))
    # A fatal verdict with no result yet: the job gets one poll to stop itself.
    return seen, Watching(carried.waited or (fatal and poll.result is None), since)

