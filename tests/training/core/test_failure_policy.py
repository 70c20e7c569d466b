"""The one failure policy: one row per case the launcher, the backends, the trigger and the operator decided
one by one before (docs/guides/reliability.md "Failure policy"; docs/reference/failure-policy.md is
generated from ROWS)."""
import json

import pytest

from ringflow.training.core.failure_policy import UNKNOWN, Action, Decision, Observation, decide, remediated
from ringflow.training.core.remediation import Remedy, RemedyAction, RemedyName
from ringflow.training.health.verdict import Verdict
from ringflow.training.formats.run_result import RunResult

SUCCEED, RETRY, FAIL, WATCH = Action
CHANGE, AS_IS, GIVE_UP = RemedyAction
LOWER_LEARNING_RATE = RemedyName.LOWER_LEARNING_RATE

ATTEMPT = "rf-job-t1"


def result(status="failed", verdict=None, attempt=ATTEMPT, replaying=False):
    return RunResult(status=status, attempt=attempt, step=12, epoch=0, world_size=2,
                     checkpoint="ckpt-000000012" if status == "succeeded" else None,
                     verdict=Verdict(verdict, f"{verdict} reason") if verdict else None, replaying=replaying)


def seen(state, exit_code=None, reason="", res=None, verdict=None, fatal=None, **more):
    v = Verdict(verdict, f"{verdict} seen") if verdict else None
    return Observation(state, exit_code, reason, res, ATTEMPT, v,
                       fatal=bool(verdict) and verdict != "HEALTHY" if fatal is None else fatal, **more)


# (observation, action, stop_job, exit_code, reason contains)
ROWS = {
    # --- the task refused the job before launch: nothing runs, a retry would meet the same config
    "bad config": (seen("pending", refused="config field 'batch_size': is 0"), FAIL, False, 2, "batch_size"),
    "engine the backend cannot run": (seen("pending", refused="engine 'ddp' cannot run as an MPIJob"), FAIL, False,
                                      2, "MPIJob"),
    # --- watching failed: the job may still run; a retry reattaches to it
    "watch error": (seen(UNKNOWN, watch_error="no job rf-x"), RETRY, False, None, "no job rf-x"),
    # --- a running job
    "running": (seen("running"), WATCH, False, None, ""),
    "running, a verdict that is not fatal": (seen("running", verdict="DEGRADED", fatal=False), WATCH, False, None, ""),
    "fatal verdict, no result yet: one poll to stop itself": (seen("running", verdict="STALLED"), WATCH, False,
                                                              None, "one poll"),
    "fatal verdict, still no result after that poll: stop, retry": (
        seen("running", verdict="STALLED", waited=True), RETRY, True, None, "health verdict STALLED"),
    "fatal NaN, still no result: stop, no retry": (
        seen("running", verdict="NONFINITE", waited=True), FAIL, True, None, "NONFINITE"),
    "fatal divergence, still no result: stop, no retry": (
        seen("running", verdict="DIVERGED", waited=True), FAIL, True, None, "DIVERGED"),
    "it stopped itself on NaN: tear down, no retry": (
        seen("running", res=result(verdict="NONFINITE"), verdict="NONFINITE"), FAIL, True, 3, "stopped itself"),
    "it stopped itself on NaN and replays that step: watch it finish": (
        seen("running", res=result(verdict="NONFINITE", replaying=True), verdict="NONFINITE", waited=True), WATCH,
        False, None, "replaying that step"),
    "it replays past the task's timeout: stop, no retry": (
        seen("running", res=result(verdict="NONFINITE", replaying=True), verdict="NONFINITE", timed_out=True), FAIL,
        True, 3, "stopped itself"),
    "it replays past the replay's limit (a frozen rank 0): stop, no retry": (
        seen("running", res=result(verdict="NONFINITE", replaying=True), verdict="NONFINITE", replay_overdue=True),
        FAIL, True, 3, "stopped itself"),
    "it was killed while it replayed: its verdict stands": (
        seen("failed", 1, "the job failed", result(verdict="NONFINITE", replaying=True)), FAIL, False, 3,
        "health verdict NONFINITE"),
    "it stopped itself on a stall: tear down, retry": (
        seen("running", res=result(verdict="STALLED"), verdict="STALLED", waited=True), RETRY, True, 5,
        "stopped itself: health verdict STALLED"),
    "fatal verdict after its recorded success: it exits on its own": (
        seen("running", res=result("succeeded", "HEALTHY"), verdict="STALLED"), WATCH, False, None, ""),
    "timed out: stop, retry": (seen("running", timed_out=True), RETRY, True, None, "timeout"),
    "timed out during the poll given to a fatal verdict: that poll first": (
        seen("running", verdict="STALLED", timed_out=True), WATCH, False, None, "one poll"),
    "a result of another attempt does not count": (
        seen("running", res=result(verdict="STALLED", attempt="rf-job-t0"), verdict="STALLED"), WATCH, False, None,
        "one poll"),
    # --- a finished job: its own result decides, whatever the process layers made of it
    "succeeded": (seen("succeeded", 0, res=result("succeeded", "HEALTHY")), SUCCEED, False, 0, ""),
    "succeeded, no result of this attempt": (seen("succeeded", 0), RETRY, False, 0, "wrote no result.json for "
                                                                                 f"attempt {ATTEMPT}"),
    "mpirun says 1, the result says NaN": (seen("failed", 1, "MPIJob failed: BackoffLimitExceeded",
                                                result(verdict="NONFINITE")), FAIL, False, 3,
                                           "health verdict NONFINITE: NONFINITE reason"),
    "the result says STALLED": (seen("failed", 1, "the job failed", result(verdict="STALLED")), RETRY, False, 5,
                                "health verdict STALLED"),
    "the result says STORE_UNAVAILABLE": (seen("failed", 1, "", result(verdict="STORE_UNAVAILABLE")), RETRY,
                                          False, 7, "STORE_UNAVAILABLE"),
    "the result says FENCED": (seen("failed", 1, "", result(verdict="FENCED")), RETRY, False, 8, "FENCED"),
    "a failed result without a verdict": (seen("failed", 1, "the job failed", result()), RETRY, False, 1,
                                          "the job failed"),
    "a failed result though the processes exited 0": (seen("succeeded", 0, "", result(verdict="STALLED")), RETRY,
                                                      False, 5, "STALLED"),
    "its work done and recorded, then killed": (seen("failed", 137, "killed (SIGKILL)", result("succeeded", "HEALTHY")),
                                                RETRY, False, 137, "killed (SIGKILL)"),
    "killed before any result": (seen("failed", 137, "killed (SIGKILL)"), RETRY, False, 137, "killed (SIGKILL)"),
    "no result, a rank's NaN in the log (a script's, on a rank other than 0): its code, no retry": (
        seen("failed", 1, "the job failed", verdict="NONFINITE"), FAIL, False, 3,
        "the job failed — health verdict NONFINITE"),
    "no result, no reason: the exit status's words": (seen("failed", 143), RETRY, False, 143, "terminated (SIGTERM)"),
    # --- out of memory: a retry as-is meets the same OOM at the same step; fail, saying what to change
    "the result says OOM (rank 0's own)": (seen("failed", 1, "the job failed", result(verdict="OOM")), FAIL, False, 9,
                                           "health verdict OOM"),
    "it stopped itself on an OOM: tear down, no retry": (
        seen("running", res=result(verdict="OOM"), verdict="OOM"), FAIL, True, 9, "stopped itself: health verdict OOM"),
    "no result, another rank's OOM in the log: its code, no retry": (
        seen("failed", 1, "the job failed", verdict="OOM"), FAIL, False, 9, "the job failed — health verdict OOM"),
    "no result, OOM-killed from outside (SIGKILL): its code, no retry": (
        seen("failed", 137, "killed (SIGKILL)", verdict="OOM"), FAIL, False, 9, "health verdict OOM"),
    "OOM seen while it runs, no result after the poll: stop, no retry": (
        seen("running", verdict="OOM", waited=True), FAIL, True, None, "health verdict OOM"),
}


@pytest.mark.parametrize("name", ROWS)
def test_the_policy(name):
    observation, action, stop_job, exit_code, says = ROWS[name]
    decision = decide(observation)
    assert (decision.action, decision.stop_job, decision.exit_code) == (action, stop_job, exit_code), decision
    assert says in decision.reason, decision.reason
    # the trigger hands the observation on as plain JSON: the operator decides the same
    again = Observation.from_dict(json.loads(json.dumps(observation.to_dict())))
    assert decide(again) == decision


def test_the_decisive_verdict_is_the_jobs_own():
    decision = decide(seen("failed", 1, "", result(verdict="DIVERGED"), verdict="STALLED"))
    assert decision.verdict.status == "DIVERGED" and decision.action == FAIL and decision.state == "failed"


@pytest.mark.parametrize("bad, says", [
    (lambda: Observation("finished"), "job state 'finished'"),
    (lambda: Observation("failed", result={"status": "failed"}), "use a RunResult"),
    (lambda: Observation("failed", verdict={"status": "NONFINITE"}), "use a health Verdict"),
    (lambda: Decision("maybe", ""), "decision 'maybe'"),
])
def test_bad_input_is_named(bad, says):
    with pytest.raises(ValueError, match=says):
        bad()


# --- the remediation policy's answer (remediation: "auto") on top of the decision
NAN_VERDICT = Verdict("NONFINITE", "NaN at step 40", {"step": 40})
CUT = Remedy(CHANGE, "NONFINITE", "learning_rate 0.01 -> 0.005", LOWER_LEARNING_RATE, {"learning_rate": 0.005})
NO_MORE = Remedy(GIVE_UP, "STORE_UNAVAILABLE", "cut twice already")
UNCHANGED = Remedy(AS_IS, "STALLED", "no remedy for STALLED")

# (decision, remedy, action, reason ends with)
REMEDIATED = {
    "a NaN the policy fails, a change: retried with it": (
        Decision(FAIL, "health verdict NONFINITE", verdict=NAN_VERDICT), CUT, RETRY,
        "; the next try: learning_rate 0.01 -> 0.005"),
    "a retry with no remedy left: failed, not retried unchanged": (
        Decision(RETRY, "store down", verdict=Verdict("STORE_UNAVAILABLE", "down", {})), NO_MORE, FAIL,
        "; no remedy left: cut twice already"),
    "nothing to change: the decision stands": (
        Decision(RETRY, "stalled", verdict=Verdict("STALLED", "hang", {})), UNCHANGED, RETRY, "stalled"),
    "a success is not the remedy's to change": (
        Decision(SUCCEED, "ok", verdict=Verdict("HEALTHY", "", {})), CUT, SUCCEED, "ok"),
    "a failure without a verdict (a crash) neither": (Decision(RETRY, "exit 1"), CUT, RETRY, "exit 1"),
}


@pytest.mark.parametrize("name", REMEDIATED)
def test_a_remedy_turns_the_decision(name):
    decision, found, action, ends = REMEDIATED[name]
    got = remediated(decision, found)
    assert got.action == action and got.reason.endswith(ends), got
    assert got.reason.startswith(decision.reason) and got.verdict == decision.verdict
