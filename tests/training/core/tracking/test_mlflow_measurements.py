"""Health records, result.json and eval.json as MLflow metrics with their step."""
import math

import pytest

from ringflow.training.health.verdict import Verdict
from ringflow.training.formats.run_result import RunResult
from ringflow.training.core.tracking.measurements import (
    Measurement, from_eval, from_health_records, from_result, from_step_record,
)

STEP = {"type": "step", "step": 20, "epoch": 0, "time": 1796039960.5, "loss": 0.66, "grad_norm": 0.8,
        "samples_per_sec": 7000.0, "step_time": [0.004, 0.002], "sync_time": [0.003, 0.001],
        "compute_time": [0.001, 0.001], "nonfinite_ranks": [], "seq": 2}


def as_dict(items):
    return {m.key: m.value for m in items}


def test_a_step_record_gives_each_measurement_at_its_step():
    items = from_step_record(STEP)
    assert {m.step for m in items} == {20} and {m.timestamp_ms for m in items} == {1796039960500}
    assert as_dict(items) == pytest.approx({
        "train/loss": 0.66, "health/grad_norm": 0.8, "health/samples_per_sec": 7000.0,
        "health/step_time_s": 0.004, "health/sync_time_s": 0.003, "health/compute_time_s": 0.001,
        "health/sync_share": 0.004 / 0.006, "health/nonfinite_ranks": 0.0})


@pytest.mark.parametrize("record, expect", [
    ({**STEP, "loss": "nan", "grad_norm": "inf", "nonfinite_ranks": [1]},
     {"train/loss": math.nan, "health/grad_norm": math.inf, "health/nonfinite_ranks": 1.0}),
    ({**STEP, "step_time": [0.0, 0.0]}, {"health/sync_share": None}),  # no share of nothing
    ({**STEP, "loss": None, "grad_norm": True}, {"train/loss": None, "health/grad_norm": None}),
])
def test_odd_values(record, expect):
    got = as_dict(from_step_record(record))
    for key, value in expect.items():
        if value is None:
            assert key not in got
        elif math.isnan(value):
            assert math.isnan(got[key])
        else:
            assert got[key] == value


@pytest.mark.parametrize("record", [
    {"type": "start", "step": 0, "world_size": 2},
    {"type": "checksum", "step": 50, "checksums": [1.0, 1.0]},
    {"type": "end", "status": "succeeded", "step": 44},
    {**STEP, "step": None}, {**STEP, "step": True},
])
def test_other_records_give_no_metrics(record):
    assert from_step_record(record) == []


def test_records_in_order():
    items = from_health_records([STEP, {"type": "start", "step": 0}, {**STEP, "step": 30, "loss": 0.3}])
    assert [(m.step, m.value) for m in items if m.key == "train/loss"] == [(20, 0.66), (30, 0.3)]


def test_result_and_eval():
    result = RunResult(status="succeeded", attempt="a", step=44, epoch=2, world_size=2, checkpoint="ckpt-000000044",
                       verdict=Verdict("HEALTHY", "ok", {}), loss=0.27, samples_per_sec_after_warmup=5000.0)
    assert {(m.key, m.value, m.step) for m in from_result(result, 7)} == {
        ("result/loss", 0.27, 44), ("result/samples_per_sec_after_warmup", 5000.0, 44)}
    doc = {"metrics": {"accuracy": 0.95, "loss": 0.2, "note": "text is not a metric"}, "step": 44}
    assert {(m.key, m.value, m.step) for m in from_eval(doc, 7)} == {("eval/accuracy", 0.95, 44),
                                                                    ("eval/loss", 0.2, 44)}
    with pytest.raises(ValueError, match="rerun the evaluate task"):
        from_eval({"step": 1}, 7)


def test_a_measurement_needs_a_name_and_a_step():
    with pytest.raises(ValueError, match="give a name"):
        Measurement("", 1.0, 0, 0)
    with pytest.raises(ValueError, match="whole number >= 0"):
        Measurement("x", 1.0, -1, 0)
