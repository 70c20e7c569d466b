"""ShardDatasetOperator: a deterministic place (training/core/runs/store_layout.py), nothing rewritten on a rerun,
new data or parameters in a new place, S3 through the Airflow connection."""
from __future__ import annotations

import json
import logging
import os
import pathlib

import pytest

from ringflow.operators.shard import ShardDatasetOperator, shard_dataset


def _files(folder: pathlib.Path) -> dict[str, float]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def test_shards_builtin_dataset_into_a_deterministic_folder(tmp_path, caplog):
    root = tmp_path / "shards"
    with caplog.at_level(logging.INFO):
        first = shard_dataset("builtin:digits", str(root), num_partitions=2, batch_size=32)
    folder = pathlib.Path(first["shard_uri"])
    assert folder.parent == root / "digits"
    assert first["manifest_uri"] == str(folder / "manifest.json")
    assert (first["partitions"], first["rows_per_partition"], first["minibatches_per_partition"]) == (2, 704, 22)
    assert first["eval_rows"] == 389 and first["remainder_rows"] == 30 and not first["reused"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["fingerprint"] == first["fingerprint"]
    assert "30 training rows did not fill a whole 32-row minibatch" in caplog.text
    assert "moved to the eval split" in caplog.text

    before = _files(folder)
    again = shard_dataset("builtin:digits", str(root), num_partitions=2, batch_size=32)
    assert again == {**first, "reused": True}
    assert _files(folder) == before  # nothing rewritten


def test_other_parameters_or_data_get_another_folder(tmp_path):
    from ringflow.training.formats.datasets import load_builtin

    root = tmp_path / "shards"
    data = tmp_path / "wine.parquet"
    df = load_builtin("wine")
    df.to_parquet(data)
    base = shard_dataset(str(data), str(root), num_partitions=2, batch_size=16)
    other_batch = shard_dataset(str(data), str(root), num_partitions=2, batch_size=8)
    other_seed = shard_dataset(str(data), str(root), num_partitions=2, batch_size=16, seed=1)
    df.iloc[:150].to_parquet(data)  # the same path, new content
    new_data = shard_dataset(str(data), str(root), num_partitions=2, batch_size=16)
    uris = {r["manifest_uri"] for r in (base, other_batch, other_seed, new_data)}
    assert len(uris) == 4
    assert all(pathlib.Path(u).parent.parent == root / "wine" for u in uris)


def test_csv_and_file_uri(tmp_path):
    from ringflow.training.formats.datasets import load_builtin

    data = tmp_path / "diabetes.csv"
    load_builtin("diabetes").to_csv(data, index=False)
    result = shard_dataset(f"file://{data}", f"file://{tmp_path}/shards", num_partitions=3, batch_size=10,
                           eval_fraction=0.1)
    assert result["manifest_uri"].startswith(f"file://{tmp_path}/shards/diabetes/w3-b10-")
    assert result["partitions"] == 3 and result["rows_per_partition"] == 130
    assert result["remainder_rows"] == 8 and result["eval_rows"] == 44 + 8


def test_operator_converts_rendered_templates(tmp_path):
    """Templates render to strings unless the DAG renders native objects: numbers are converted."""
    op = ShardDatasetOperator(task_id="shard", dataset_uri="builtin:wine", output_uri=str(tmp_path),
                              num_partitions="2", batch_size="16", seed="0", eval_fraction="0.25")
    result = op.execute({})
    assert result["partitions"] == 2 and result["batch_size"] == 16
    assert set(ShardDatasetOperator.template_fields) >= {"dataset_uri", "output_uri", "num_partitions", "batch_size"}


@pytest.mark.parametrize("kwargs, error", [
    ({"dataset_uri": "builtin:wine", "target": "nope"}, "target column 'nope'"),
    ({"dataset_uri": "builtin:wine", "batch_size": 500}, "cannot fill one minibatch"),
    ({"dataset_uri": "/tmp/data.json"}, "use a .parquet or .csv file"),
    ({"dataset_uri": "builtin:mnist"}, "unknown built-in dataset"),
])
def test_bad_requests_fail_with_what_to_change(tmp_path, kwargs, error):
    args = {"num_partitions": 2, "batch_size": 16, **kwargs}
    with pytest.raises(ValueError, match=error):
        shard_dataset(args.pop("dataset_uri"), str(tmp_path / "shards"), **args)
    assert not (tmp_path / "shards").exists() or not any((tmp_path / "shards").rglob("manifest.json"))


@pytest.mark.job
def test_s3_through_the_airflow_connection(s3_server, s3_connection, tmp_path):
    from ringflow.training.formats.datasets import load_builtin

    bucket = s3_server.new_bucket()
    client = s3_server.boto3_client()
    path = tmp_path / "digits.parquet"
    load_builtin("digits").to_parquet(path)
    client.upload_file(str(path), bucket, "datasets/digits.parquet")
    assert "AWS_ACCESS_KEY_ID" not in os.environ  # only the connection holds credentials

    result = shard_dataset(f"s3://{bucket}/datasets/digits.parquet", f"s3://{bucket}/ml/shards", num_partitions=2,
                           batch_size=32, conn_id=s3_connection)
    assert result["manifest_uri"].startswith(f"s3://{bucket}/ml/shards/digits/w2-b32-")
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="ml/shards/")["Contents"]}
    prefix = result["manifest_uri"][len(f"s3://{bucket}/"):].rsplit("/", 1)[0]
    assert keys == {f"{prefix}/{n}" for n in ("manifest.json", "part-00000.parquet", "part-00001.parquet",
                                              "eval.parquet")}
    again = shard_dataset(f"s3://{bucket}/datasets/digits.parquet", f"s3://{bucket}/ml/shards", num_partitions=2,
                          batch_size=32)  # no conn_id: the default connection, ringflow_s3
    assert again["reused"] and again["manifest_uri"] == result["manifest_uri"]


@pytest.mark.parametrize("column, value", [("pixel_6_6", "n/a"), ("pixel_1_1", float("nan")),
                                           ("target", float("inf"))])
def test_data_training_cannot_use_is_refused_and_nothing_is_written(tmp_path, column, value):
    """Whatever the suite said before: the shard step checks features and target itself (input_gate)."""
    from ringflow.training.formats.datasets import load_builtin
    from ringflow.training.core.input_gate import UntrainableData

    df = load_builtin("digits")
    df[column] = df[column].astype(object if isinstance(value, str) else "float64")
    df.loc[[5, 6], column] = value
    data = tmp_path / "digits.csv"
    df.to_csv(data, index=False)
    root = tmp_path / "shards"
    op = ShardDatasetOperator(task_id="shard", dataset_uri=str(data), output_uri=str(root), num_partitions=2,
                              batch_size=32)
    with pytest.raises(UntrainableData, match=rf"column '{column}': 2 of 1797 rows .* at rows \[5, 6\]"):
        op.execute({})
    assert not root.exists() or not any(root.rglob("*"))


def test_the_old_num_workers_is_refused_when_the_dag_is_parsed():
    """num_workers was the number of partition files: the old spelling fails at parse time, naming the new one."""
    with pytest.raises(TypeError) as raised:
        ShardDatasetOperator(task_id="shard", dataset_uri="builtin:wine", output_uri="/tmp/x", num_workers=3,
                             batch_size=16)
    assert str(raised.value) == ("ShardDatasetOperator: num_workers is now num_partitions (the number of partition "
                                 "files; any number of workers trains on them): pass num_partitions=3")
    with pytest.raises(TypeError, match="needs num_partitions"):
        ShardDatasetOperator(task_id="shard", dataset_uri="builtin:wine", output_uri="/tmp/x", batch_size=16)
