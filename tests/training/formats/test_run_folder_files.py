"""What a run's readers read and the tasks after an attempt write, through the RunFolder alone (run_folder.py):
the published result, eval.json, the health records and plot, the heartbeat, on a local folder and on S3;
and RunFolder.open, the one way a run folder is opened from a URI and S3 settings."""
import json

import pytest

from ringflow.training.health.heartbeat import Heartbeat
from ringflow.training.health.records import HealthLog, record
from ringflow.training.formats.eval_result import EvalResult, EvalResultError
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.formats.run_result import ResultError, RunResult

EVAL = EvalResult(metrics={"accuracy": 0.9, "loss": 0.3}, checkpoint="ckpt-000000010", step=10, rows=100,
                  task="classification", evaluated_at="2026-01-01T00:00:00Z")


def result(attempt, status="succeeded"):
    return RunResult(status=status, attempt=attempt, step=10, epoch=1, world_size=2, loss=0.25,
                     checkpoint="ckpt-000000010" if status == "succeeded" else None)


def test_a_new_folder_has_nothing_to_read(object_store):
    run = RunFolder(object_store)
    assert run.read_result() is None and run.read_eval() is None
    assert run.read_health() == [] and run.read_heartbeat() is None


def test_the_published_result_of_the_current_attempt(object_store):
    run = RunFolder(object_store)
    run.claim("t0").publish_result(result("t0").to_json())
    assert run.read_result() == result("t0") and run.read_result("t0") == result("t0")
    assert run.read_result("t1") is None  # another attempt's result is not this attempt's
    attempt = run.claim("t1")
    assert run.read_result() is None  # claimed: only what the current attempt publishes counts
    attempt.publish_result(result("t1", "failed").to_json())
    assert run.read_result("t1").status == "failed"


def test_an_unreadable_result_is_a_problem_to_fix_not_a_missing_one(object_store):
    attempt = RunFolder(object_store).claim("t1")
    attempt.publish_result(b"{not json")
    with pytest.raises(ResultError, match="result.json is not JSON"):
        RunFolder(object_store).read_result()


def test_eval_round_trips_and_a_broken_one_says_to_rerun_evaluate(object_store):
    run = RunFolder(object_store)
    assert run.write_eval(EVAL) == run.eval_uri and run.eval_uri.endswith("/eval.json")
    assert run.read_eval() == EVAL
    assert json.loads(object_store.get_bytes("eval.json")) == EVAL.to_dict()
    for raw, says in ((b"[1, 2]", "holds a list"), (b"{", "is not JSON"), (b'{"metrics": 3}', "no 'checkpoint'")):
        object_store.put_bytes("eval.json", raw)
        with pytest.raises(EvalResultError, match=f"eval.json.*{says}.*evaluate the run again"):
            run.read_eval()


def test_health_records_heartbeat_and_plot(object_store, tmp_path):
    run = RunFolder(object_store)
    attempt = run.claim("t1")
    log = HealthLog(attempt.store, flush_seconds=0.0, attempt="t1")
    for step in range(3):
        log.append(record("step", step=step), force_flush=True)
    assert [r["step"] for r in run.read_health()] == [0, 1, 2]
    beat = Heartbeat(attempt="t1", seq=0, time=1.0, step=2, silent_seconds=0.1, progress_at=0.9)
    attempt.store.put_bytes("heartbeat.json", beat.to_json())
    assert run.read_heartbeat() == beat  # the current attempt's
    plot = tmp_path / "plot.png"
    plot.write_bytes(b"\x89PNG")
    assert run.write_health_plot(str(plot)) == run.health_plot_uri
    assert object_store.get_bytes("health.png") == b"\x89PNG"
    assert run.training_files() == ["health.png"]  # no result published yet
    attempt.publish_result(result("t1").to_json())
    assert run.training_files() == ["attempts/000001/result.json", "health.png"]


def test_open_keeps_the_uri_it_was_given(tmp_path):
    run = RunFolder.open(str(tmp_path / "runs" / "r1"))
    assert run.uri == str(tmp_path / "runs" / "r1") and run.s3 is None
    assert run.eval_uri == f"{tmp_path}/runs/r1/eval.json"
    run.write_eval(EVAL)
    assert RunFolder.open((tmp_path / "runs" / "r1").as_uri()).read_eval() == EVAL


@pytest.mark.job
def test_open_an_s3_folder_with_the_settings_given(s3_server):
    bucket = s3_server.new_bucket()
    run = RunFolder.open(f"s3://{bucket}/runs/r1", s3_server.settings())
    assert run.s3 == s3_server.settings()
    run.write_eval(EVAL)
    assert RunFolder.open(f"s3://{bucket}/runs/r1", s3_server.settings()).read_eval() == EVAL
