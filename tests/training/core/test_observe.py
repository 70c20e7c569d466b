"""What one poll of the trigger counts as (training/core/observe.py): one row per fact the trigger made up
itself before (docs/guides/reliability.md: Failure policy); the trigger only polls and reports (tests/operators/test_trigger.py)."""
import pytest

from ringflow.training.core.backends.base import JobState, JobStatus
from ringflow.training.core.failure_policy import Action, decide
from ringflow.training.core.observe import (REPLAY_OVERDUE_GRACE_SECONDS, Poll, Watching, observe,
                                            replay_limit_seconds, wants_result)
from ringflow.training.formats.run_result import RunResult
from ringflow.training.health.oom import STEP_NOT_KNOWN
from ringflow.training.health.verdict import Verdict

ATTEMPT = "rf-job-t1"
T0 = 1_000_000.0
STALLED = {"status": "STALLED", "reason": "no step for 60 s", "evidence": {"rank": 1}, "fatal": True,
           "attempt": ATTEMPT}
DEGRADED = {"status": "DEGRADED", "reason": "sync-bound", "evidence": {"kind": "sync_share"}, "fatal": False}
NAN = {"status": "NONFINITE", "reason": "NaN/Inf in rank(s) [1]", "evidence": {"step": 40}, "fatal": True}
OOM_KILLED = Verdict("OOM", f"a rank ran out of memory {STEP_NOT_KNOWN}: OOMKilled", {"kind": "oom_killed"})


def replaying(attempt=ATTEMPT):
    return RunResult(status="failed", attempt=attempt, step=40, epoch=0, world_size=2,
                     verdict=Verdict("NONFINITE", "NaN", {"step": 40}), replaying=True)


def poll(state="running", watched=None, result=None, at=T0, verdict=None, last_step=None):
    return Poll(JobStatus(state, verdict=verdict), watched, last_step, result, ATTEMPT, at)


# (poll, carried, timeout_at | verdict status, fatal, waited, timed_out, replay_overdue, carried on, action)
ROWS = {
    "running, nothing seen": (poll(), Watching(), None, None, False, False, False, False, Watching(), Action.WATCH),
    "a verdict that is not fatal": (poll(watched=DEGRADED), Watching(), None, "DEGRADED", False, False, False, False,
                                    Watching(), Action.WATCH),
    "a fatal verdict, no result: the next poll has waited one": (
        poll(watched=STALLED), Watching(), None, "STALLED", True, False, False, False, Watching(waited=True),
        Action.WATCH),
    "the poll after it: the policy stops it": (
        poll(watched=STALLED), Watching(waited=True), None, "STALLED", True, True, False, False,
        Watching(waited=True), Action.RETRY),
    "the backend saw it OOM-killed: its verdict, at rank 0's next step": (
        poll("failed", watched=STALLED, verdict=OOM_KILLED, last_step=7), Watching(), None, "OOM", True, False, False,
        False, Watching(waited=True), Action.FAIL),
    "past the task's timeout": (poll(at=T0 + 11), Watching(), T0 + 10, None, False, False, True, False, Watching(),
                                Action.RETRY),
    "its replay starts the timer": (poll(watched=NAN, result=replaying()), Watching(), None, "NONFINITE", True,
                                    False, False, False, Watching(replaying_since=T0), Action.WATCH),
    "within the replay's limit": (poll(watched=NAN, result=replaying(), at=T0 + replay_limit_seconds({})),
                                  Watching(False, T0), None, "NONFINITE", True, False, False, False,
                                  Watching(False, T0), Action.WATCH),
    "past it: stuck in its replay": (poll(watched=NAN, result=replaying(), at=T0 + replay_limit_seconds({}) + 1),
                                     Watching(False, T0), None, "NONFINITE", True, False, False, True,
                                     Watching(False, T0), Action.FAIL),
    "another attempt's replay starts nothing": (poll(watched=NAN, result=replaying("rf-job-t0")), Watching(), None,
                                                "NONFINITE", True, False, False, False, Watching(), Action.WATCH),
}


@pytest.mark.parametrize("name", ROWS)
def test_what_a_poll_counts_as(name):
    got_poll, carried, timeout_at, verdict, fatal, waited, timed_out, overdue, carried_on, action = ROWS[name]
    seen, after = observe(got_poll, carried, timeout_at=timeout_at, health={})
    assert (seen.verdict.status if seen.verdict else None, seen.fatal, seen.waited) == (verdict, fatal, waited)
    assert (seen.timed_out, seen.replay_overdue, after) == (timed_out, overdue, carried_on), (seen, after)
    assert seen.state == got_poll.status.state and seen.attempt == ATTEMPT
    assert decide(seen).action == action


def test_an_oom_seen_outside_gets_the_step_rank_0_reached():
    seen, _ = observe(poll("failed", verdict=OOM_KILLED, last_step=7), Watching(), timeout_at=None, health={})
    assert seen.verdict.evidence["step"] == 8 and "at step 8" in seen.verdict.reason


def test_the_replay_limit_is_the_jobs_own_replay_time_and_a_grace():
    assert replay_limit_seconds({"replay_seconds": 30}) == 30 + REPLAY_OVERDUE_GRACE_SECONDS


@pytest.mark.parametrize("state, watched, wants", [
    ("running", None, False), ("running", DEGRADED, False), ("running", STALLED, True),
    ("failed", None, True), ("succeeded", None, True),
])
def test_the_result_is_read_only_when_it_can_matter(state, watched, wants):
    assert wants_result(JobStatus(state), watched) is wants


def test_a_poll_carries_the_backends_status():
    with pytest.raises(ValueError, match="use the backend's JobStatus"):
        Poll({"state": "running"}, None, None, None, ATTEMPT, T0)
    assert poll().status.state is JobState.RUNNING
