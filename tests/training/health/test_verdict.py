"""The health verdict as a table of cases: records in, verdict and evidence out."""
import pytest

from ringflow.training.config import HealthConfig
from ringflow.training.health.verdict import judge

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
    ("stall record", steps(5) + [{"type": "stall", "time": 1100.0, "rank": 1, "last_step": 5, "seconds": 31.0}],
     None, "STALLED", {"rank": 1, "last_step": 5}),
    ("silent too long, seen from outside", steps(5), 1005.0 + 31, "STALLED", {"last_step": 5}),
    ("silent but finished", steps(5) + [{"type": "end", "time": 1006.0, "status": "succeeded"}], 5000.0,
     "HEALTHY", {}),
    ("nonfinite outranks divergence", [checksum(1, [1.0, 2.0]), step(2, grad_norm="nan")], None, "NONFINITE", {}),
    ("old attempt's NaN is not held against a resumed run",
     [{"type": "start", "time": 0.0}, step(1, grad_norm="nan"), {"type": "start", "time": 2000.0}] + steps(3),
     None, "HEALTHY", {}),
]


@pytest.mark.parametrize("name, records, now, status, evidence", CASES, ids=[c[0] for c in CASES])
def test_verdict_table(name, records, now, status, evidence):
    verdict = judge(records, CFG, now=now)
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
