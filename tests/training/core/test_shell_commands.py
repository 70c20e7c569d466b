"""The pipeline's steps from a shell (training/core/cli.py), in process: each command's good path, and each bad
input answered with one line on stderr (the problem and the fix, no traceback) and its exit code."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pandas as pd
import pytest
from evaluated_runs import make_run, make_trained_run

from ringflow.training.core import cli
from ringflow.training.formats import exit_codes
from ringflow.training.core.registry.model_registry import ModelRegistry
from ringflow.training.store import LocalFolderStore

SUITE = pathlib.Path(__file__).parents[2] / "operators" / "suites" / "digits.json"


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, code, *argv, says):
    got, _, err = run(capsys, *argv)
    assert got == code, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("[ringflow] "), err
    assert says in err, err


def tables(tmp_path) -> dict[str, pathlib.Path]:
    """The datasets a new user tried: empty, too few rows, a truncated Parquet file, a CSV whose type changes
    after the first block."""
    pd.DataFrame({"a": pd.Series([], dtype="float64"), "target": pd.Series([], dtype="int64")}).to_parquet(
        tmp_path / "empty.parquet")
    pd.DataFrame({"a": [1.0, 2.0, 3.0], "target": [0, 1, 0]}).to_parquet(tmp_path / "few.parquet")
    pd.DataFrame({"a": np.arange(5000.0), "target": np.arange(5000) % 2}).to_parquet(tmp_path / "good.parquet")
    whole = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "truncated.parquet").write_bytes(whole[:len(whole) // 2])
    rows = ["a,target"] + [f"{i},{i % 2}" for i in range(200_000)] + ["x,1"]
    (tmp_path / "typechange.csv").write_text("\n".join(rows))
    return {p.stem: p for p in tmp_path.iterdir()}


@pytest.mark.parametrize("name, says", [
    ("empty", "the dataset has no rows"),
    ("few", "cannot fill one minibatch of 8 on each of 2 workers"),
    ("truncated", "is not a readable Parquet file"),
    ("typechange", "column 'a' (int64 from the first rows) holds a value of another type further down"),
])
def test_shard_answers_bad_tables_with_one_line(tmp_path, capsys, name, says):
    path = tables(tmp_path)[name]
    refused(capsys, exit_codes.CONFIG, "shard", path, tmp_path / "out", "--workers", 2, "--batch-size", 8, says=says)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_shard_then_validate_good_data(tmp_path, capsys):
    code, out, _ = run(capsys, "shard", "builtin:digits", tmp_path / "shards", "--workers", 2, "--batch-size", 32)
    assert code == 0 and json.loads(out)["partitions"] == 2
    code, out, _ = run(capsys, "validate", "builtin:digits", "--suite", SUITE)
    assert code == 0 and json.loads(out)["rows"] == 1797 and json.loads(out)["suite"] == "digits"


def test_validate_reports_a_broken_dataset_and_refuses_bad_input(tmp_path, capsys):
    df = pd.read_parquet(tables(tmp_path)["good"])
    df.loc[3, "a"] = np.nan
    df.to_parquet(tmp_path / "gaps.parquet")
    code, out, err = run(capsys, "validate", tmp_path / "gaps.parquet", "--suite", SUITE)
    assert code == exit_codes.ERROR and json.loads(out)["rows"] == 5000
    assert "feature column 'a': 1 of 5000 rows" in err and "Traceback" not in err
    refused(capsys, exit_codes.CONFIG, "validate", "builtin:digits", "--suite", tmp_path / "nope.json",
            says="does not exist; put it next to the DAG file")
    (tmp_path / "bad.json").write_text('{"expectations": [{"type": "expect_colum_values_to_be_nul"}]}')
    refused(capsys, exit_codes.CONFIG, "validate", "builtin:digits", "--suite", tmp_path / "bad.json",
            says="expectation #0")
    refused(capsys, exit_codes.CONFIG, "validate", tmp_path / "no.parquet", "--suite", SUITE, says="does not exist")
    refused(capsys, exit_codes.CONFIG, "validate", "builtin:nope", "--suite", SUITE, says="unknown built-in")


def test_train_refuses_a_shard_changed_after_sharding_before_any_rank_starts(tmp_path, capsys):
    code, out, _ = run(capsys, "shard", "builtin:digits", tmp_path / "shards", "--workers", 2, "--batch-size", 32)
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"manifest_uri": str(tmp_path / "shards" / "manifest.json"),
                                  "run_uri": str(tmp_path / "run"), "epochs": 1, "batch_size": 32}))
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    shard = tmp_path / "shards" / manifest["partitions"][1]["key"]
    whole = shard.read_bytes()
    data = bytearray(whole)
    data[-12] ^= 0xFF  # same size, another footer (its metadata ends 8 bytes before the end)
    shard.write_bytes(bytes(data))
    refused(capsys, exit_codes.CONFIG, "train", config, "--np", 2, says="fails its checksum")
    data = bytearray(whole)
    data[len(data) // 2] ^= 0xFF  # same size, same footer, other rows: only reading every byte finds it
    shard.write_bytes(bytes(data))
    refused(capsys, exit_codes.CONFIG, "train", config, "--np", 2, "--verify-shards", says="fails its checksum")
    shard.write_bytes(bytes(data[:100]))
    refused(capsys, exit_codes.CONFIG, "train", config, "--np", 2, says="the manifest says")
    shard.unlink()
    refused(capsys, exit_codes.CONFIG, "train", config, "--np", 2, says="does not exist")
    assert not (tmp_path / "run").exists()  # nothing was launched


def test_evaluate_writes_eval_json_and_refuses_a_run_without_result(tmp_path, capsys):
    run(capsys, "shard", "builtin:digits", tmp_path / "shards", "--workers", 2, "--batch-size", 32)
    checkpoint = make_trained_run(LocalFolderStore(tmp_path / "run"), str(tmp_path / "shards" / "manifest.json"), 30)
    code, out, _ = run(capsys, "evaluate", tmp_path / "run")
    assert code == 0 and json.loads(out)["checkpoint"] == checkpoint
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["metrics"] == json.loads(out)["metrics"]
    refused(capsys, exit_codes.CONFIG, "evaluate", tmp_path / "empty", says="train it first or name a checkpoint")
    refused(capsys, exit_codes.CONFIG, "evaluate", tmp_path / "run", "--checkpoint", "ckpt-000000099",
            says="ckpt-000000099")


def test_promote_and_rollback(tmp_path, capsys):
    registry = tmp_path / "ml"
    store = LocalFolderStore(registry)
    promote = ("promote", "--registry", registry, "--model", "digits")
    code, out, _ = run(capsys, promote[0], registry / "runs" / make_run(store, "r1", 0.90), *promote[1:])
    assert code == 0 and json.loads(out)["version"] == 1 and json.loads(out)["promoted"]
    code, out, _ = run(capsys, promote[0], registry / "runs" / make_run(store, "r2", 0.95), *promote[1:])
    assert code == 0 and json.loads(out)["previous"] == 1
    # The gate says no: the outcome on stdout, the reason on one line, and a code a script's `&&` stops at.
    code, out, err = run(capsys, promote[0], registry / "runs" / make_run(store, "r3", 0.80), *promote[1:])
    assert code == exit_codes.ERROR and not json.loads(out)["promoted"]
    assert "worse than production version 2" in err and err.count("\n") == 1
    code, out, _ = run(capsys, "rollback", "--registry", registry, "--model", "digits")
    assert code == 0 and json.loads(out)["version"] == 1
    assert ModelRegistry(store).production("digits").version == 1
    code, out, _ = run(capsys, "rollback", "--registry", registry, "--model", "digits", "--to", 2)
    assert code == 0 and json.loads(out)["version"] == 2


def test_promote_and_rollback_refuse_bad_input(tmp_path, capsys):
    registry = tmp_path / "ml"
    store = LocalFolderStore(registry)
    promote = ("--registry", registry, "--model", "digits")
    refused(capsys, exit_codes.CONFIG, "promote", registry / "runs" / "never", *promote, says="result.json does not exist")
    make_run(store, "no-eval", 0.9)
    store.delete("runs/no-eval/eval.json")
    refused(capsys, exit_codes.CONFIG, "promote", registry / "runs" / "no-eval", *promote,
            says="the evaluate task did not run (ringflow evaluate")
    store.put_bytes("runs/no-eval/eval.json", b'{"metrics": []}')
    refused(capsys, exit_codes.CONFIG, "promote", registry / "runs" / "no-eval", *promote, says="eval.json")
    run_uri = registry / "runs" / make_run(store, "r1", 0.9)
    refused(capsys, exit_codes.CONFIG, "promote", run_uri, *promote, "--metric", "f1", says="no metric 'f1'")
    refused(capsys, exit_codes.CONFIG, "promote", run_uri, *promote, "--mode", "best", says="gate mode is 'best'")
    refused(capsys, exit_codes.CONFIG, "promote", run_uri, *promote, "--threshold", "high", says="use a number")
    refused(capsys, exit_codes.CONFIG, "promote", tmp_path / "elsewhere" / "r1", *promote,
            says="not inside the registry's store")
    refused(capsys, exit_codes.CONFIG, "rollback", *promote, says="no production version to roll back from")
    refused(capsys, exit_codes.CONFIG, "rollback", "--registry", registry, "--model", "bad/name",
            says="must be letters, digits")
