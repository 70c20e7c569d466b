"""EvaluateModelOperator on run folders laid out the way a training job leaves them (checkpoint with its
meta, result.json), made here in one process so the test needs no Horovod."""
from __future__ import annotations

import json
import os

import pytest

from evaluated_runs import make_trained_run as make_run

from ringflow.operators.evaluate import EvaluateModelOperator, RunNotEvaluable
from ringflow.operators.shard import shard_dataset


def test_scores_the_final_checkpoint_and_writes_eval_json(tmp_path):
    from ringflow.training.store import LocalFolderStore

    shards = shard_dataset("builtin:digits", str(tmp_path / "shards"), num_partitions=2, batch_size=32)
    run = tmp_path / "runs" / "r1"
    checkpoint = make_run(LocalFolderStore(run), shards["manifest_uri"], steps=60)

    result = EvaluateModelOperator(task_id="evaluate", run_uri=str(run)).execute({})
    assert result["checkpoint"] == checkpoint and result["step"] == 60
    assert result["rows"] == shards["eval_rows"] == 389 and result["task"] == "classification"
    assert 0.85 < result["metrics"]["accuracy"] <= 1.0 and result["metrics"]["loss"] > 0
    assert result["eval_uri"] == f"{run}/eval.json"
    assert json.loads((run / "eval.json").read_text())["metrics"] == result["metrics"]


def test_regression_metrics_and_an_explicit_checkpoint(tmp_path):
    from ringflow.training.store import LocalFolderStore

    shards = shard_dataset("builtin:diabetes", str(tmp_path / "shards"), num_partitions=2, batch_size=16)
    run = tmp_path / "run"
    checkpoint = make_run(LocalFolderStore(run), shards["manifest_uri"], steps=5)
    result = EvaluateModelOperator(task_id="evaluate", run_uri=str(run), checkpoint=checkpoint).execute({})
    assert set(result["metrics"]) == {"mse", "mae", "r2", "loss"}
    assert result["metrics"]["mse"] == result["metrics"]["loss"] > 0


def test_a_run_without_result_fails_clearly(tmp_path):
    with pytest.raises(RunNotEvaluable, match="result.json"):
        EvaluateModelOperator(task_id="evaluate", run_uri=str(tmp_path / "empty")).execute({})


def test_a_failed_run_has_no_checkpoint_to_score(tmp_path):
    from ringflow.training.health.verdict import Verdict
    from ringflow.training.formats.run_result import RunResult
    from run_folder_files import write_result
    from ringflow.training.store import LocalFolderStore

    write_result(LocalFolderStore(tmp_path / "run"), RunResult(
        status="failed", attempt="a1", step=4, epoch=0, world_size=2, verdict=Verdict("NONFINITE", "NaN")))
    with pytest.raises(RunNotEvaluable, match="the run failed .attempt a1. and has no final checkpoint"):
        EvaluateModelOperator(task_id="evaluate", run_uri=str(tmp_path / "run")).execute({})


def test_template_fields():
    assert set(EvaluateModelOperator.template_fields) == {"run_uri", "checkpoint", "conn_id"}


@pytest.mark.job
def test_s3_run_is_read_with_the_connection_settings_alone(s3_server, s3_connection, tmp_path):
    from ringflow.operators.connections import open_store_for, s3_settings_from_connection

    bucket = s3_server.new_bucket()
    shards = shard_dataset("builtin:wine", f"s3://{bucket}/ml/shards", num_partitions=2, batch_size=8,
                           conn_id=s3_connection)
    run_uri = f"s3://{bucket}/ml/runs/dag/run-1"
    make_run(open_store_for(run_uri, s3_connection), shards["manifest_uri"], steps=20,
             s3=s3_settings_from_connection(s3_connection))

    result = EvaluateModelOperator(task_id="evaluate", run_uri=run_uri, conn_id=s3_connection).execute({})
    assert result["rows"] > 0 and 0 <= result["metrics"]["accuracy"] <= 1
    # run folder and shards alike were opened with the connection's settings: none went into the environment
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ and "RINGFLOW_S3_ENDPOINT" not in os.environ
    assert result["eval_uri"] == f"{run_uri}/eval.json"
    stored = json.loads(open_store_for(run_uri, s3_connection).get_bytes("eval.json"))
    assert stored["metrics"] == result["metrics"]
