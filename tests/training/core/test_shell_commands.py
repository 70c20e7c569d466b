"""The pipeline's steps from a shell (training/core/cli.py), in process: each command's good path, each bad
argument refused by the parser (usage and one error line, exit 2: the table at the end), and each bad input
found while a command runs answered with one line on stderr (the problem and the fix, no traceback) and its
exit code."""
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
    ("few", "cannot fill one minibatch of 8 on each of 2 partitions"),
    ("truncated", "is not a readable Parquet file"),
    ("typechange", "column 'a' (int64 from the first rows) holds a value of another type further down"),
])
def test_shard_answers_bad_tables_with_one_line(tmp_path, capsys, name, says):
    path = tables(tmp_path)[name]
    refused(capsys, exit_codes.CONFIG, "shard", path, tmp_path / "out", "--partitions", 2, "--batch-size", 8, says=says)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_shard_then_validate_good_data(tmp_path, capsys):
    code, out, _ = run(capsys, "shard", "builtin:digits", tmp_path / "shards", "--partitions", 2, "--batch-size", 32)
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
    (tmp_path / "bad.json").write_text('{"expectations": [{"type": "expect_colum_values_to_be_nul"}]}')
    refused(capsys, exit_codes.CONFIG, "validate", "builtin:digits", "--suite", tmp_path / "bad.json",
            says="expectation #0")


def test_train_refuses_a_shard_changed_after_sharding_before_any_rank_starts(tmp_path, capsys):
    code, out, _ = run(capsys, "shard", "builtin:digits", tmp_path / "shards", "--partitions", 2, "--batch-size", 32)
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
    run(capsys, "shard", "builtin:digits", tmp_path / "shards", "--partitions", 2, "--batch-size", 32)
    checkpoint = make_trained_run(LocalFolderStore(tmp_path / "run"), str(tmp_path / "shards" / "manifest.json"), 30)
    code, out, _ = run(capsys, "evaluate", tmp_path / "run")
    assert code == 0 and json.loads(out)["checkpoint"] == checkpoint
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["metrics"] == json.loads(out)["metrics"]
    (tmp_path / "empty").mkdir()
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
    (registry / "runs" / "never").mkdir(parents=True)
    refused(capsys, exit_codes.CONFIG, "promote", registry / "runs" / "never", *promote, says="result.json does not exist")
    make_run(store, "no-eval", 0.9)
    store.delete("runs/no-eval/eval.json")
    refused(capsys, exit_codes.CONFIG, "promote", registry / "runs" / "no-eval", *promote,
            says="the evaluate task did not run (ringflow evaluate")
    store.put_bytes("runs/no-eval/eval.json", b'{"metrics": []}')
    refused(capsys, exit_codes.CONFIG, "promote", registry / "runs" / "no-eval", *promote, says="eval.json")
    run_uri = registry / "runs" / make_run(store, "r1", 0.9)
    refused(capsys, exit_codes.CONFIG, "promote", run_uri, *promote, "--metric", "f1", says="no metric 'f1'")
    (tmp_path / "elsewhere" / "r1").mkdir(parents=True)
    refused(capsys, exit_codes.CONFIG, "promote", tmp_path / "elsewhere" / "r1", *promote,
            says="not inside the registry's store")
    refused(capsys, exit_codes.CONFIG, "rollback", *promote, says="no production version to roll back from")


# -- bad arguments: refused where they are parsed ------------------------------------------------------------
# Each row: the arguments (FILE, FOLDER, MISSING, CONFIG, SUITE stand for paths the test makes) and what the
# error line says. Every one exits 2 before the command runs, with the usage and that one line, no traceback.
TRAIN, SHARD = ("train", "CONFIG"), ("shard", "builtin:digits", "FOLDER/out")
PROMOTE = ("promote", "FOLDER", "--registry", "FOLDER", "--model", "digits")
BAD_ARGUMENTS = [
    ((), "the following arguments are required: command"),
    (("fit",), "argument command: invalid choice: 'fit'"),
    (("train",), "the following arguments are required: config"),
    (("train", "MISSING"), "argument config: 'MISSING' does not exist: give the path of an existing file"),
    (("train", "FOLDER"), "argument config: 'FOLDER' is a folder: give the path of an existing file"),
    (("train", "http://example.com/job.json"), "give a path, a file:// or an s3:// URI"),
    ((*TRAIN, "--np", "-2"), "argument --np: '-2': give a whole number >= 1"),
    ((*TRAIN, "--np", "0"), "argument --np: '0': give a whole number >= 1"),
    ((*TRAIN, "--np", "two"), "argument --np: 'two': give a whole number >= 1"),
    ((*TRAIN, "--retries", "-1"), "argument --retries: '-1': give a whole number >= 0"),
    ((*TRAIN, "--retries", "two"), "argument --retries: 'two': give a whole number >= 0"),
    ((*TRAIN, "--retries", "1.5"), "argument --retries: '1.5': give a whole number >= 0"),
    ((*TRAIN, "--engine", "jax"), "argument --engine: invalid choice: 'jax' (choose from 'horovod', 'ddp', "
                                  "'tensorflow')"),
    ((*TRAIN, "--controller", "nccl"), "argument --controller: invalid choice: 'nccl'"),
    ((*TRAIN, "--remediation", "maybe"), "argument --remediation: invalid choice: 'maybe'"),
    (("shard", "builtin:digits", "FOLDER/out", "--workers", "2", "--batch-size", "32"),
     "--workers is now --partitions N (the number of partition files to write)"),
    ((*SHARD, "--workers"), "--workers is now --partitions N"),
    ((*SHARD, "--batch-size", "32"), "the following arguments are required: --partitions"),
    ((*SHARD, "--partitions", "0", "--batch-size", "32"), "argument --partitions: '0': give a whole number >= 1"),
    ((*SHARD, "--partitions", "2", "--batch-size", "-8"), "argument --batch-size: '-8': give a whole number >= 1"),
    ((*SHARD, "--partitions", "2", "--batch-size", "8", "--seed", "-1"), "argument --seed: '-1': give a whole"),
    ((*SHARD, "--partitions", "2", "--batch-size", "8", "--eval-fraction", "1"),
     "argument --eval-fraction: '1': give a fraction >= 0 and < 1"),
    ((*SHARD, "--partitions", "2", "--batch-size", "8", "--eval-fraction", "nan"), "'nan': give a fraction"),
    ((*SHARD, "--partitions", "2", "--batch-size", "8", "--target", ""), "argument --target: an empty name"),
    (("shard", "builtin:mnist", "FOLDER/out", "--partitions", "2", "--batch-size", "8"),
     "argument dataset: 'builtin:mnist': unknown built-in dataset; give one of builtin:digits"),
    (("shard", "MISSING", "FOLDER/out", "--partitions", "2", "--batch-size", "8"), "'MISSING' does not exist"),
    (("shard", "builtin:digits", "FILE", "--partitions", "2", "--batch-size", "8"),
     "argument out: 'FILE' is a file: give a folder to write into"),
    (("validate", "builtin:digits", "--suite", "MISSING"), "argument --suite: 'MISSING' does not exist"),
    (("validate", "builtin:digits"), "the following arguments are required: --suite"),
    (("validate", "builtin:nope", "--suite", "SUITE"), "argument dataset: 'builtin:nope': unknown built-in"),
    (("validate", "MISSING", "--suite", "SUITE"), "argument dataset: 'MISSING' does not exist"),
    (("health", "MISSING"), "argument run: 'MISSING' does not exist: give the path of an existing folder"),
    (("health", "FILE"), "argument run: 'FILE' is a file: give the path of an existing folder"),
    (("evaluate", "MISSING"), "argument run: 'MISSING' does not exist"),
    (("evaluate", "FOLDER", "--checkpoint", " "), "argument --checkpoint: an empty name"),
    (("promote", "FOLDER", "--registry", "MISSING", "--model", "digits"), "argument --registry: 'MISSING' does not"),
    (("promote", "FOLDER", "--registry", "FOLDER"), "the following arguments are required: --model"),
    (("promote", "FOLDER", "--registry", "FOLDER", "--model", "bad/name"),
     "argument --model: 'bad/name': give a model name of letters, digits"),
    ((*PROMOTE, "--mode", "best"), "argument --mode: invalid choice: 'best' (choose from 'max', 'min')"),
    ((*PROMOTE, "--threshold", "high"), "argument --threshold: 'high': give a number"),
    ((*PROMOTE, "--threshold", "nan"), "argument --threshold: 'nan': give a number"),
    ((*PROMOTE, "--metric", ""), "argument --metric: an empty name"),
    ((*PROMOTE, "--allowed-verdicts", "GOOD"), "argument --allowed-verdicts: invalid choice: 'GOOD'"),
    (("rollback", "--registry", "FOLDER", "--model", "digits", "--to", "0"), "argument --to: '0': give a whole"),
    (("rollback", "--registry", "FOLDER", "--model", "digits", "--from-version", "v2"),
     "argument --from-version: 'v2': give a whole number >= 1"),
    (("rollback", "--model", "digits"), "the following arguments are required: --registry"),
    (("demo", "--workdir", "FILE"), "argument --workdir: 'FILE' is a file: give a folder to write into"),
]


@pytest.mark.parametrize("argv, says", BAD_ARGUMENTS, ids=[" ".join(a) or "nothing" for a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_in_one_line(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "FILE").write_text("")
    (tmp_path / "CONFIG").write_text("{}")
    (tmp_path / "SUITE").write_text(SUITE.read_text())
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    err = capsys.readouterr().err
    assert exited.value.code == 2 == exit_codes.CONFIG and "Traceback" not in err, err
    assert err.startswith("usage: ringflow") and err.endswith("\n"), err
    last = err.splitlines()[-1]
    assert last.startswith("ringflow") and ": error: " in last and says in last, err


@pytest.mark.parametrize("argv, says", [
    ([], "the following arguments are required: config"),
    (["MISSING"], "argument config: 'MISSING' is not a file: give the job config's path, file:// or s3:// URI"),
    (["CONFIG", "extra"], "unrecognized arguments: extra"),
])
def test_the_rank_entry_refuses_a_bad_argument_in_one_line(tmp_path, capsys, monkeypatch, argv, says):
    """`python -m ringflow.training CONFIG` (training/__main__.py), as a launcher starts a rank."""
    from ringflow.training.__main__ import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "CONFIG").write_text("{}")
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err, err
    assert err.startswith("usage: python -m ringflow.training") and says in err.splitlines()[-1], err


def test_train_help_lists_every_engine(capsys):
    from ringflow.training.formats.engines import ENGINES

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    words = " ".join(capsys.readouterr().out.split())
    assert all(f"{engine}: " in words for engine in ENGINES) and ENGINES == ("horovod", "ddp", "tensorflow")
