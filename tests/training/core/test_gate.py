"""The promotion gate as tables: the arguments a DAG renders (text from templates), and the decisions."""
from __future__ import annotations

import pytest

from ringflow.training.core.gate import Gate, GateError, build_gate
from ringflow.training.core.registry.model_registry import Pointer


@pytest.mark.parametrize("args, expect", [
    ({}, ("accuracy", "max", None)),
    ({"metric": "mse", "mode": "min", "threshold": 0.5}, ("mse", "min", 0.5)),
    # what templates render to: text
    ({"metric": " loss ", "mode": "min", "threshold": "0.3"}, ("loss", "min", 0.3)),
    ({"threshold": "None"}, ("accuracy", "max", None)),
    ({"threshold": ""}, ("accuracy", "max", None)),
    ({"threshold": "null"}, ("accuracy", "max", None)),
    ({"mode": "median"}, "gate mode is 'median'; use 'max'"),
    ({"metric": ""}, "gate metric is ''; name a metric of eval.json"),
    ({"threshold": "high"}, "gate threshold rendered to 'high'; use a number"),
    ({"threshold": float("nan")}, "gate threshold is nan"),
])
def test_build_gate(args, expect):
    if isinstance(expect, str):
        with pytest.raises(ValueError, match=expect):
            build_gate(**args)
    else:
        gate = build_gate(**args)
        assert (gate.metric, gate.mode, gate.threshold) == expect


def production(accuracy):
    return Pointer(version=3, sha256={}, run_uri="/r", checkpoint="c", metrics={"accuracy": accuracy},
                   promoted_at="t", previous=None)


@pytest.mark.parametrize("gate, verdict, metrics, prod, reason", [
    (Gate(), "HEALTHY", {"accuracy": 0.9}, None, None),
    (Gate(), "HEALTHY", {"accuracy": 0.9}, production(0.95), "worse than production version 3"),
    (Gate(compare_to_production=False), "HEALTHY", {"accuracy": 0.9}, production(0.95), None),
    (Gate(threshold=0.95), "HEALTHY", {"accuracy": 0.9}, None, "does not reach the threshold (>= 0.95)"),
    (Gate(), "STALLED", {"accuracy": 0.99}, None, "health verdict is 'STALLED'"),
    (Gate(), None, {"accuracy": 0.99}, None, "no health verdict"),
    (Gate(allowed_verdicts=None), None, {"accuracy": 0.99}, None, None),
    (Gate(), "HEALTHY", {"accuracy": float("nan")}, None, "not a number"),
    (Gate(metric="loss", mode="min"), "HEALTHY", {"loss": 0.2}, None, None),
])
def test_gate_check(gate, verdict, metrics, prod, reason):
    said = gate.check(verdict, metrics, prod)
    assert said is None if reason is None else reason in said


def test_a_bad_gate_is_a_gate_error():
    with pytest.raises(GateError, match="gate mode is 'best'"):
        Gate(mode="best")


REMEDIED = [{"try": 2, "verdict": "NONFINITE", "remedy": "lower_learning_rate", "words": "NaN at step 40"}]


@pytest.mark.parametrize("gate, remedies, reason", [
    (Gate(), REMEDIED, None),  # by default a remediated run may be promoted
    (Gate(require_no_remediation=True), REMEDIED, "try 2: lower_learning_rate after NONFINITE"),
    (Gate(require_no_remediation=True), [], None),
    (build_gate(require_no_remediation=True), REMEDIED, "requires no remediation"),
])
def test_the_gate_may_require_no_remediation(gate, remedies, reason):
    said = gate.check("HEALTHY", {"accuracy": 0.9}, None, remedies)
    assert said is None if reason is None else reason in said


def test_require_no_remediation_is_a_bool():
    with pytest.raises(GateError, match="require_no_remediation"):
        Gate(require_no_remediation="yes")
