"""What comes after a try (training/core/attempts.py): one row per case the train operator's execute_complete
decided with its own loop before, and `ringflow train --retries` now decides the same (docs/guides/reliability.md:
Failure policy; docs/guides/job-config.md: `remediation`)."""
import json

import pytest

from ringflow.training.core.attempts import Next, NextTry, next_try
from ringflow.training.core.failure_policy import Action, Decision, Observation, decide
from ringflow.training.core.remediation import PlannedRemedy, Remedy, RemedyAction, RemedyName
from ringflow.training.formats.config import JobConfig
from ringflow.training.formats.engines import LOCAL, TRAINJOB
from ringflow.training.formats.run_result import RunResult
from ringflow.training.health.verdict import Verdict

ATTEMPT = "rf-job-t1"
NAN = Verdict("NONFINITE", "NaN/Inf in rank(s) [1]", {"step": 40, "ranks": [1]})
STORE = Verdict("STORE_UNAVAILABLE", "the store is down", {"store": "s3://b/run", "operation": "get"})
OOM = Verdict("OOM", "out of memory", {"kind": "torch_oom", "rank": 0, "step": 3, "advice": []})
SYNC = Verdict("DEGRADED", "sync-bound", {"kind": "sync_share", "share": 0.9, "steps": [10, 200]})
SLOW = Verdict("DEGRADED", "straggler", {"kind": "straggler", "rank": 1, "ratio": 2.0, "steps": [10, 200]})
STALL = Verdict("STALLED", "no step for 60 s", {"rank": 1})
CUT = Remedy(RemedyAction.CHANGE, "NONFINITE", "cut", RemedyName.LOWER_LEARNING_RATE, {"learning_rate": 0.005})


def failed(verdict=None, world_size=2):
    """A finished try whose own result says it failed on `verdict` (None: a crash with no verdict)."""
    result = RunResult(status="failed", attempt=ATTEMPT, step=12, epoch=0, world_size=world_size, verdict=verdict)
    return Observation("failed", 1, "the job failed", result, ATTEMPT)


def config(**fields):
    return JobConfig.from_dict({"manifest_uri": "m/manifest.json", "run_uri": "runs/r", "remediation": "auto",
                                "learning_rate": 0.01, "batch_size": 32} | fields)


SUCCEEDED = Observation("succeeded", 0, "", RunResult(status="succeeded", attempt=ATTEMPT, step=44, epoch=2,
                                                      world_size=2, checkpoint="ckpt-000000044"), ATTEMPT)

# (observation, config (None: not known), planned so far, try, tries, backend | action, said contains,
#  the planned remedy (its try and name) or None)
ROWS = {
    "succeeded: no next try": (SUCCEEDED, config(), [], 1, 3, LOCAL, Next.SUCCEED, "", None),
    "a crash: retried as it was": (failed(), config(), [], 1, None, LOCAL, Next.RETRY, "", None),
    "a crash on the last try: no try left": (failed(), config(), [], 3, 3, LOCAL, Next.FAIL,
                                             "; no try left (try 3 of 3)", None),
    "a stall: no remedy for it, retried as it was": (failed(STALL), config(), [], 1, None, LOCAL, Next.RETRY, "",
                                                     None),
    "a NaN without remediation: the policy fails it": (failed(NAN), config(remediation="off"), [], 1, None, LOCAL,
                                                       Next.FAIL, "", None),
    "a NaN, auto: retried with the learning rate cut": (failed(NAN), config(), [], 1, None, LOCAL,
                                                        Next.RETRY_CHANGED, "; the next try: NaN/Inf at step 40",
                                                        (2, RemedyName.LOWER_LEARNING_RATE)),
    "a NaN after two cuts: no remedy left": (failed(NAN), config(), [PlannedRemedy(2, CUT), PlannedRemedy(3, CUT)],
                                             3, None, LOCAL, Next.FAIL, "; no remedy left: NaN/Inf again", None),
    "a cut planned for a later try is not history": (failed(NAN), config(), [PlannedRemedy(3, CUT)] * 2, 2, None,
                                                     LOCAL, Next.RETRY_CHANGED, "cut 1 of 2",
                                                     (3, RemedyName.LOWER_LEARNING_RATE)),
    "a NaN whose config is not known: nothing remedied": (failed(NAN), None, [], 1, None, LOCAL, Next.FAIL, "",
                                                          None),
    "a NaN on the last try: no try left, no remedy planned": (failed(NAN), config(), [], 2, 2, LOCAL, Next.FAIL,
                                                              "; no try left (try 2 of 2)", None),
    "a store outage: wait, then retry": (failed(STORE), config(), [], 1, None, LOCAL, Next.WAIT_THEN_RETRY,
                                         "wait 60s", (2, RemedyName.WAIT_FOR_STORE)),
    "an OOM: a smaller batch on the workers the try ran": (failed(OOM, world_size=4), config(), [], 1, 3, LOCAL,
                                                           Next.RETRY_CHANGED, "split 1 of 2",
                                                           (2, RemedyName.SMALLER_BATCH)),
    "a sync-bound verdict that did not end the try: not remedied": (
        failed(SYNC), config(), [], 1, None, LOCAL, Next.RETRY, "", None),
    "a sync-bound verdict that ended it: wider buckets": (
        failed(SYNC), config(health={"stop_on_degraded": True}), [], 1, None, LOCAL, Next.RETRY_CHANGED,
        "fusion_threshold_mb 64 -> 128", (2, RemedyName.WIDER_BUCKETS)),
    "a straggler on Kubernetes: off its node": (
        failed(SLOW), config(health={"stop_on_degraded": True}), [], 1, None, TRAINJOB, Next.RETRY_CHANGED,
        "node-b", (2, RemedyName.AVOID_NODE)),
    "a straggler on this machine: no remedy left": (
        failed(SLOW), config(health={"stop_on_degraded": True}), [], 1, None, LOCAL, Next.FAIL, "same host", None),
    "watching failed: retried (it reattaches)": (Observation("unknown", watch_error="no job rf-x"), config(), [], 1,
                                                 None, LOCAL, Next.RETRY, "", None),
}


@pytest.mark.parametrize("name", ROWS)
def test_the_next_try(name):
    seen, cfg, planned, try_number, tries, backend, action, says, remedy = ROWS[name]
    decision = decide(seen)
    got = next_try(seen, decision, cfg, planned, try_number, tries, backend_kind=backend, num_workers=2,
                   rank_nodes={0: "node-a", 1: "node-b"})
    assert got.action == action, got
    assert says in got.said and got.reason == decision.reason + got.said, got.said
    assert got.retries == (action in (Next.RETRY, Next.RETRY_CHANGED, Next.WAIT_THEN_RETRY))
    assert (None if got.planned is None else (got.planned.try_number, got.planned.remedy.remedy)) == remedy
    if got.planned is not None:  # recorded as a line of remedies.jsonl, read back the same
        assert PlannedRemedy.from_dict(json.loads(json.dumps(got.planned.to_dict()))) == got.planned


def test_an_oom_is_split_for_the_workers_the_try_ran_on():
    """The try's own result says its world size (fewer workers than asked for, under min_workers)."""
    got = next_try(failed(OOM, world_size=4), decide(failed(OOM)), config(batch_size=64), [], 1, None,
                   backend_kind=LOCAL, num_workers=8)
    assert got.planned.remedy.settings["batch_size"] == 32 and got.wait_seconds == 0.0


def test_the_wait_and_the_remedy_that_gave_up_are_said():
    store = next_try(failed(STORE), decide(failed(STORE)), config(), [], 1, None, backend_kind=LOCAL, num_workers=2)
    assert store.wait_seconds == 60.0 and not store.gave_up
    slow = failed(SLOW)
    local = next_try(slow, decide(slow), config(health={"stop_on_degraded": True}), [], 1, None, backend_kind=LOCAL,
                     num_workers=2)
    assert local.gave_up and local.remedy.action == RemedyAction.GIVE_UP


def test_nothing_is_decided_while_the_job_runs():
    running = Observation("running", attempt=ATTEMPT)
    with pytest.raises(ValueError, match="nothing to decide after try 1 yet"):
        next_try(running, decide(running), config(), [], 1, None, backend_kind=LOCAL, num_workers=2)


@pytest.mark.parametrize("bad, says", [
    (lambda: NextTry("maybe", Decision(Action.RETRY, "x")), "next try 'maybe'"),
    (lambda: NextTry(Next.RETRY_CHANGED, Decision(Action.RETRY, "x")), "records the remedy it runs with"),
    (lambda: NextTry("retry", Decision(Action.RETRY, "x"), planned=PlannedRemedy(2, CUT)), "any other none"),
])
def test_bad_input_is_named(bad, says):
    with pytest.raises(ValueError, match=says):
        bad()


def test_its_words_are_plain_strings():
    assert NextTry("fail", Decision("fail", "x")).action is Next.FAIL and f"{Next.FAIL}" == "fail"
    assert json.dumps({"action": Next.WAIT_THEN_RETRY}) == '{"action": "wait_then_retry"}'
