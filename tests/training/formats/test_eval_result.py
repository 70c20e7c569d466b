"""eval.json as a typed, strict document: what it round-trips, and the one-line error naming the file."""
from __future__ import annotations

import json

import pytest

from ringflow.training.formats.eval_result import EvalResult, EvalResultError
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import LocalFolderStore

GOOD = {"metrics": {"accuracy": 0.9, "loss": 0.3}, "checkpoint": "ckpt-000000040", "step": 40, "rows": 389,
        "task": "classification", "evaluated_at": "2026-01-01T00:00:00Z"}


def test_round_trip_through_a_run_folder(tmp_path):
    run = RunFolder(LocalFolderStore(tmp_path))
    assert run.read_eval() is None
    result = EvalResult.from_dict(GOOD)
    run.write_eval(result)
    assert run.read_eval() == result
    assert json.loads((tmp_path / "eval.json").read_text())["format"] == "ringflow.eval/v1"


def test_a_nan_metric_is_kept_as_written_text():
    result = EvalResult.from_dict({**GOOD, "metrics": {"loss": float("nan")}})
    assert result.to_dict()["metrics"] == {"loss": "nan"}
    again = EvalResult.from_json(result.to_json())
    assert again.metrics["loss"] != again.metrics["loss"]  # NaN


@pytest.mark.parametrize("raw, match", [
    (b"not json", "is not JSON"),
    (b"[1, 2]", "holds a list, not an evaluation"),
    (json.dumps({**GOOD, "metrics": {"accuracy": "high"}}).encode(), r"metrics \{'accuracy': 'high'\} are not numbers"),
    (json.dumps({**GOOD, "metrics": {}}).encode(), "non-empty mapping"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "checkpoint"}).encode(), "has no 'checkpoint'"),
    (json.dumps({**GOOD, "task": "ranking"}).encode(), "task is 'ranking'"),
    (json.dumps({**GOOD, "step": -1}).encode(), "step is -1"),
    (json.dumps({**GOOD, "format": "other/v9"}).encode(), "is format 'other/v9'"),
])
def test_bad_files_are_named_with_what_is_wrong(tmp_path, raw, match):
    store = LocalFolderStore(tmp_path)
    store.put_bytes("eval.json", raw)
    with pytest.raises(EvalResultError, match=match) as excinfo:
        RunFolder(store).read_eval()
    message = str(excinfo.value)
    assert f"{tmp_path}/eval.json" in message and "evaluate" in message and "\n" not in message
