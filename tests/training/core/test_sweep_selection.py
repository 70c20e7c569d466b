"""A sweep's selection as tables: which candidate wins (select_best), and what a candidate may be; and
read_candidate on run folders."""
from __future__ import annotations

import pytest
from evaluated_runs import make_run

from ringflow.training.core.gate import Gate
from ringflow.training.core.run_reader import run_folder_in
from ringflow.training.core.sweep_selection import Candidate, read_candidate, select_best
from ringflow.training.store import LocalFolderStore


def ok(index: int, value: float, verdict: str = "HEALTHY", metric: str = "accuracy") -> Candidate:
    return Candidate(index, f"/s/runs/d/r/g/m{index}", status="succeeded", checkpoint=f"ck{index}", verdict=verdict,
                     metrics={metric: value})


FAILED = Candidate(1, "/s/m1", status="failed", verdict="NONFINITE")
NO_RESULT = Candidate(2, "/s/m2", problem="no result.json: its train task failed before the job finished")


@pytest.mark.parametrize("candidates, gate, winner, reason_has", [
    ([ok(0, 0.90), ok(1, 0.95), ok(2, 0.93)], Gate(), 1, {0: "candidate 1 has 0.95", 2: "not the best"}),
    ([ok(0, 0.30), ok(1, 0.10)], Gate(metric="mse", mode="min"), None, {}),  # metric missing: see next row
    ([ok(0, 0.30, metric="mse"), ok(1, 0.10, metric="mse")], Gate(metric="mse", mode="min"), 1, {0: "min is better"}),
    # an unhealthy candidate never wins, however good its metric
    ([ok(0, 0.80), ok(1, 0.99, verdict="UNHEALTHY")], Gate(), 0, {1: "UNHEALTHY"}),
    ([ok(0, 0.80), ok(1, 0.99, verdict="DEGRADED")], Gate(), 1, {0: "not the best"}),
    ([ok(0, 0.80), ok(1, 0.99, verdict="DEGRADED")], Gate(allowed_verdicts=("HEALTHY",)), 0, {1: "DEGRADED"}),
    ([ok(0, 0.80), ok(1, 0.99, verdict=None)], Gate(), 0, {1: "no health verdict"}),
    # a failed candidate, or one that left no result, never wins
    ([FAILED, ok(0, 0.5)], Gate(), 0, {1: "did not succeed"}),
    ([NO_RESULT, FAILED], Gate(), None, {1: "did not succeed", 2: "no result.json"}),
    ([ok(0, float("nan")), ok(1, float("inf"))], Gate(), None, {0: "not a number", 1: "not a finite number"}),
    ([ok(0, 0.7), ok(1, 0.8)], Gate(threshold=0.9), None, {0: "threshold", 1: "threshold"}),
    ([ok(3, 0.9), ok(1, 0.9)], Gate(), 1, {3: "candidate 1"}),  # a tie: the lower index
    ([], Gate(), None, {}),
])
def test_select_best(candidates, gate, winner, reason_has):
    selection = select_best(candidates, gate)
    assert selection.winner == winner
    assert winner not in selection.reasons
    assert set(selection.reasons) == {c.index for c in candidates} - {winner}
    for index, text in reason_has.items():
        assert text in selection.reasons[index], selection.reasons[index]


def test_a_missing_metric_is_named():
    assert "no metric 'mse'" in select_best([ok(0, 0.3)], Gate(metric="mse", mode="min")).reasons[0]


def test_production_is_not_asked_when_selecting():
    """The registry compares the winner with production when it promotes; selecting only ranks candidates."""
    assert select_best([ok(0, 0.1)], Gate(compare_to_production=True)).winner == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"index": -1, "run_uri": "/r", "status": "succeeded"}, "map index"),
    ({"index": 0, "run_uri": "/r"}, "status"),
])
def test_candidate_is_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Candidate(**kwargs)


def test_read_candidate_reads_the_typed_eval_and_names_what_is_missing(tmp_path):
    store = LocalFolderStore(tmp_path)
    uri = str(tmp_path)
    make_run(store, "m0", 0.9)
    m0, m1 = (run_folder_in(store, uri, f"{uri}/runs/{run}") for run in ("m0", "m1"))
    assert read_candidate(m0, 0).metrics == {"accuracy": 0.9, "loss": 1 - 0.9}
    assert read_candidate(m0, 0).run_uri == f"{uri}/runs/m0"
    store.delete("runs/m0/eval.json")
    assert "no eval.json" in read_candidate(m0, 0).problem
    store.put_bytes("runs/m0/eval.json", b'{"metrics": {"accuracy": "high"}}')
    assert "unreadable eval.json" in read_candidate(m0, 0).problem
    assert "no result.json" in read_candidate(m1, 1).problem
