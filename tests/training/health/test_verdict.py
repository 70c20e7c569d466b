"""The health verdict as a table of cases: records in, verdict and evidence out; the incremental judge
agrees with it however the records arrive."""
import random

import pytest

from ringflow.training.formats.config import HealthConfig
from ringflow.training.health.verdict import STARTUP_SECONDS, HealthJudge, judge, stall_limit, stalled, thresholds

CFG = HealthConfig(window_steps=10, straggler_ratio=1.5, max_sync_share=0.5, stall_seconds=30,
                   divergence_tolerance=1e-6)


def step(n, compute=(0.01, 0.01), sync=(0.001, 0.001), grad_norm=1.0, nonfinite=(), t=1000.0):
    step_time = [c + s for c, s in zip(compute, sync)]
    return {"type": "step", "step": n, "time": t + n, "step_time": step_time, "sync_time": list(sync),
            "compute_time": list(compute), "loss": 0.5, "grad_norm": grad_norm, "nonfinite_ranks": list(nonfinite)}


def steps(count, **kw):
    return [step(n, **kw) for n in range(1, count + 1)]


def checksum(n, sums):
    return {"type": "checksum", "step": n, "time": 1000.0 + n, "checksums": sums}


def start(attempt, t=0.0):
    return {"type": "start", "time": t, "attempt": attempt}


def of(attempt, records):
    return [r | {"attempt": attempt} for r in records]


STALL = {"type": "stall", "time": 1100.0, "rank": 1, "last_step": 5, "seconds": 31.0, "limit": 30.0}
STORE = {"type": "store", "time": 1100.0, "store": "s3://b/run", "operation": "upload of checkpoint ckpt-000000050",
         "seconds": 301.0, "limit": 300.0, "seen_by": "the watchdog of rank 0", "last_step": 52}


CASES = [
    ("empty", [], None, "HEALTHY", {}),
    ("steady", steps(20), None, "HEALTHY", {"last_step": 20}),
    ("nan in rank 1", steps(3) + [step(4, nonfinite=[1], grad_norm="nan")], None, "NONFINITE", {"step": 4, "ranks": [1]}),
    ("inf gradient norm", steps(3) + [step(4, grad_norm="inf")], None, "NONFINITE", {"step": 4, "ranks": []}),
    ("began on rank 1 between measurements",
     steps(9) + [step(10, nonfinite=[0, 1], grad_norm="nan") | {"first_nonfinite_step": [5, 4]}], None,
     "NONFINITE", {"step": 4, "ranks": [1], "detected_at_step": 10}),
    ("replicas equal", steps(5) + [checksum(5, [12.5, 12.5])], None, "HEALTHY", {}),
    ("replica drift", steps(5) + [checksum(5, [12.5, 12.51])], None, "DIVERGED", {"rank": 1, "step": 5}),
    ("NaN parameters", steps(5) + [checksum(5, ["nan", "nan"])], None, "NONFINITE", {"ranks": [0, 1], "step": 5}),
    ("straggler rank 1", steps(10, compute=(0.01, 0.05), sync=(0.04, 0.001)), None, "DEGRADED",
     {"kind": "straggler", "rank": 1}),
    ("straggler rank 0 of 4", steps(10, compute=(0.08, 0.01, 0.011, 0.012), sync=(0.001, 0.07, 0.07, 0.07)),
     None, "DEGRADED", {"kind": "straggler", "rank": 0}),
    ("mild imbalance is fine", steps(10, compute=(0.010, 0.012), sync=(0.002, 0.001)), None, "HEALTHY", {}),
    ("a large ratio of tiny times is timer noise", steps(10, compute=(0.001, 0.003)), None, "HEALTHY", {}),
    ("too few steps to call a straggler", steps(3, compute=(0.01, 0.05)), None, "HEALTHY", {}),
    ("sync bound", steps(10, compute=(0.01, 0.01), sync=(0.03, 0.03)), None, "DEGRADED", {"kind": "sync_share"}),
    ("stall record", steps(5) + [STALL], None, "STALLED", {"rank": 1, "last_step": 5, "limit": 30.0}),
    ("stall record of a run that stored no limit", steps(5) + [STALL | {"limit": None}], None, "STALLED",
     {"rank": 1, "seconds": 31.0}),
    ("finished", steps(5) + [{"type": "end", "time": 1006.0, "status": "succeeded"}], None, "HEALTHY", {}),
    ("nonfinite outranks divergence", [checksum(1, [1.0, 2.0]), step(2, grad_norm="nan")], None, "NONFINITE", {}),
    ("old attempt's NaN is not held against a resumed run",
     [{"type": "start", "time": 0.0}, step(1, grad_norm="nan"), {"type": "start", "time": 2000.0}] + steps(3),
     None, "HEALTHY", {}),
    ("a retry is not judged on its previous attempt's stall",
     [start("a1")] + of("a1", steps(5) + [STALL]) + [start("a2")] + of("a2", steps(3)), None, "HEALTHY",
     {"last_step": 3}),
    ("a late write of an earlier attempt does not count",
     [start("a1")] + of("a1", steps(2)) + [start("a2")] + of("a2", steps(2)) + of("a1", [STALL]), None,
     "HEALTHY", {}),
    ("one attempt's own stall", [start("a1")] + of("a1", steps(5) + [STALL]), None, "STALLED", {"rank": 1}),
    ("a start-up stall names its phase", [STALL | {"last_step": None, "phase": "fetch"}], None, "STALLED",
     {"phase": "fetch", "last_step": None}),
    ("store record: the store's verdict, not STALLED", steps(5) + [STORE], None, "STORE_UNAVAILABLE",
     {"store": "s3://b/run", "operation": "upload of checkpoint ckpt-000000050", "seconds": 301.0, "limit": 300.0}),
    ("a store that failed after every retry", steps(5) + [STORE | {"error": "HTTP 503 SlowDown", "limit": None}],
     None, "STORE_UNAVAILABLE", {"error": "HTTP 503 SlowDown"}),
    ("nonfinite outranks a store verdict", steps(5) + [STORE, step(6, grad_norm="nan")], None, "NONFINITE", {}),
]


@pytest.mark.parametrize("name, records, now, status, evidence", CASES, ids=[c[0] for c in CASES])
def test_verdict_table(name, records, now, status, evidence):
    verdict = judge(records, CFG)
    assert verdict.status == status, verdict.reason
    for key, value in evidence.items():
        assert verdict.evidence[key] == value
    assert verdict.reason


def test_fatal_statuses():
    assert judge(steps(2) + [step(3, grad_norm="nan")], CFG).is_fatal()
    degraded = judge(steps(10, compute=(0.01, 0.05)), CFG)
    assert degraded.status == "DEGRADED" and not degraded.is_fatal() and degraded.is_fatal(stop_on_degraded=True)


def test_reason_says_what_to_do():
    verdict = judge(steps(10, compute=(0.01, 0.05)), CFG)
    assert "rank 1" in verdict.reason and "slower" in verdict.reason


def test_judge_of_a_named_attempt_ignores_the_others():
    records = [start("a1")] + of("a1", steps(5) + [STALL]) + [start("a2")] + of("a2", steps(3))
    assert judge(records, CFG, attempt="a1").status == "STALLED"
    assert judge(records, CFG, attempt="a2").status == "HEALTHY"
    assert judge(records, CFG, attempt="a3").evidence["steps_measured"] == 0


STALLED_CASES = [
    # silent, limit, stalled?
    (29.9, 30.0, False),
    (30.0, 30.0, False),  # the limit itself is still alive
    (30.1, 30.0, True),
    (0.0, None, True),    # a stall record of an old run: already judged
]


@pytest.mark.parametrize("silent, limit, expected", STALLED_CASES)
def test_stalled_is_more_silence_than_the_limit(silent, limit, expected):
    verdict = stalled(silent, limit, 7, "someone", rank=1)
    assert (verdict is not None) == expected
    if verdict:
        assert verdict.status == "STALLED" and verdict.evidence["last_step"] == 7 and "someone" in verdict.reason


def test_thresholds_are_the_last_attempts():
    records = [start("a1") | {"health": {"stall_seconds": 7}}, start("a2") | {"health": {"stall_seconds": 9,
                                                                                          "future_field": 1}}]
    assert thresholds(records).stall_seconds == 9
    assert thresholds([start("a1")]) is None and thresholds([]) is None


def _histories():
    """Record sequences of every kind judge() sees: long, resumed, fatal, stragglers, other attempts."""
    slow = steps(30, compute=(0.01, 0.05), sync=(0.04, 0.001))
    nan = step(40, nonfinite=[1], grad_norm="nan") | {"first_nonfinite_step": [None, 38]}
    yield steps(50)
    yield slow
    yield steps(3) + slow[:4] + steps(20)
    yield [start("a1")] + of("a1", steps(12) + [checksum(12, [1.0, 1.5])] + steps(5) + [nan])
    yield [start("a1")] + of("a1", slow + [STALL]) + [start("a2")] + of("a2", steps(25, compute=(0.01, 0.011)))
    yield [start("a1")] + of("a1", steps(5)) + [start("a2")] + of("a2", slow) + of("a1", [STALL, nan])
    yield steps(8, compute=(0.01, 0.01), sync=(0.03, 0.03)) + [checksum(8, ["nan", 2.0])] + steps(4)
    rng = random.Random(7)
    pool = [*steps(10), *slow[:10], STALL, nan, checksum(3, [1.0, 1.0]), checksum(4, [1.0, 1.1]), start("a1"),
            start("a2"), {"type": "end", "time": 0.0}] + of("a1", steps(5)) + of("a2", slow[:5])
    for _ in range(40):
        yield [rng.choice(pool) for _ in range(rng.randint(0, 60))]


@pytest.mark.parametrize("window", [1, 3, 10])
def test_incremental_judge_equals_judge_in_any_chunks(window):
    cfg = HealthConfig(window_steps=window, straggler_ratio=1.5, max_sync_share=0.5, stall_seconds=30)
    rng = random.Random(window)
    for records in _histories():
        expected = judge(records, cfg)
        for _ in range(3):
            incremental, i = HealthJudge(cfg), 0
            while i < len(records):
                n = rng.randint(1, 7)
                incremental.feed(records[i:i + n])
                i += n
            assert incremental.verdict() == expected, records
        assert HealthJudge(cfg).feed(records).verdict() == expected


@pytest.mark.parametrize("name, records, now, status, evidence", CASES, ids=[c[0] for c in CASES])
def test_the_judges_fatal_finding_is_its_verdict_when_fatal_and_none_otherwise(name, records, now, status, evidence):
    """fatal() is what the training loop asks after every measurement; the window is judged only on request."""
    fed = HealthJudge(CFG).feed(records)
    verdict = fed.verdict()
    assert fed.fatal() == (verdict if verdict.is_fatal() else None)


@pytest.mark.parametrize("stall_seconds, starting, limit", [(30, False, 30), (30, True, STARTUP_SECONDS),
                                                            (300, True, 300), (300, False, 300)])
def test_stall_limit_allows_for_start_up(stall_seconds, starting, limit):
    assert stall_limit(stall_seconds, starting) == limit
