"""result.json: what the worker writes is what every reader gets back, strict JSON, one attempt's only."""
import json
import math

import pytest

from ringflow.training.formats import exit_codes
from ringflow.training.health.verdict import Verdict
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.formats.run_result import FORMAT, ResultError, RunResult
from run_folder_files import read_result, write_result
from ringflow.training.store import LocalFolderStore


def failed(status="NONFINITE", **kwargs):
    fields = dict(status="failed", attempt="a1", step=12, epoch=0, world_size=2,
                  verdict=Verdict(status, "NaN/Inf in rank(s) [1]", {"ranks": (1,), "grad_norm": math.nan}))
    return RunResult(**fields | kwargs)


def succeeded(**kwargs):
    fields = dict(status="succeeded", attempt="a2", step=44, epoch=2, world_size=2, checkpoint="ckpt-000000044",
                  verdict=Verdict("HEALTHY", "no sign of trouble"), loss=0.25, resumed_from="ckpt-000000010",
                  samples_per_sec_after_warmup=5100.0, health_monitor_share_after_warmup=0.013)
    return RunResult(**fields | kwargs)


def test_round_trip_is_strict_json_with_a_format(tmp_path):
    for result in (failed(), succeeded()):
        raw = result.to_json()
        doc = json.loads(raw, parse_constant=lambda c: pytest.fail(f"bare {c} in result.json"))
        assert doc["format"] == FORMAT == "ringflow.result/v1"
        again = RunResult.from_json(raw)
        assert again.to_dict() == result.to_dict()
    nan = RunResult.from_json(failed().to_json())
    assert math.isnan(nan.loss) and nan.verdict.evidence == {"ranks": [1], "grad_norm": "nan"}
    assert RunResult.from_json(succeeded().to_json()) == succeeded()
    remedied = succeeded(remedies=({"try": 2, "verdict": "OOM", "remedy": "smaller_batch", "words": "w"},))
    assert RunResult.from_json(remedied.to_json()) == remedied and remedied.remediated
    assert not succeeded().remediated and json.loads(succeeded().to_json())["remedies"] == []


@pytest.mark.parametrize("result, code", [
    (succeeded(), 0), (failed("NONFINITE"), 3), (failed("DIVERGED"), 4), (failed("STALLED"), 5),
    (failed("DEGRADED"), 6), (failed(verdict=None), 1),
])
def test_exit_code_comes_from_the_one_table(result, code):
    assert result.exit_code == code
    if code:
        assert exit_codes.meaning(code) in ("the job failed", f"health verdict {result.verdict and result.verdict.status}")


@pytest.mark.parametrize("change, says", [
    ({"status": "done"}, "result status 'done': use one of"),
    ({"checkpoint": None}, "a succeeded result names its final checkpoint"),
    ({"status": "failed"}, "a failed result has no final checkpoint"),
    ({"attempt": ""}, "use the launch's attempt id"),
    ({"step": -1}, "result step is -1; use a whole number >= 0"),
    ({"world_size": 0}, "result world_size is 0; use a whole number >= 1"),
    ({"verdict": {"status": "HEALTHY"}}, "use a health Verdict"),
])
def test_a_result_the_worker_could_not_write_is_refused(change, says):
    with pytest.raises(ResultError, match=says):
        succeeded(**change)


def test_a_reader_gets_only_its_own_attempt(tmp_path):
    store = LocalFolderStore(tmp_path)
    assert read_result(store) is None and read_result(store, "a2") is None
    write_result(store, succeeded())
    assert read_result(store, "a2") == succeeded() and read_result(store) == succeeded()
    assert read_result(store, "a1") is None  # an earlier or later attempt's result is not this job's


@pytest.mark.parametrize("raw, says", [
    (b"{not json", "is not JSON"),
    (b"[]", "holds a list, not a ringflow result"),
    (json.dumps(succeeded().to_dict() | {"format": "ringflow.result/v9"}).encode(), "is format 'ringflow.result/v9'"),
    (json.dumps({"format": FORMAT, "status": "succeeded"}).encode(), "is not a ringflow result"),
])
def test_unreadable_results_say_so(tmp_path, raw, says):
    store = LocalFolderStore(tmp_path)
    RunFolder(store).claim("a2").publish_result(raw)
    with pytest.raises(ResultError, match=says):
        read_result(store)


def test_a_result_from_before_the_format_is_refused_saying_to_start_a_new_run():
    """Results had no `format` (nor always an attempt) before the first release: such a run folder is retrained."""
    doc = succeeded().to_dict()
    del doc["format"], doc["attempt"]
    with pytest.raises(ResultError, match=r"has no format: an earlier ringflow wrote it; start a new run \(a new "
                                          r"run_uri\) and retrain"):
        RunResult.from_json(json.dumps(doc))
