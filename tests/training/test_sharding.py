import numpy as np
import pandas as pd
import pytest

from ringflow.training.datasets import load_builtin
from ringflow.training.manifest import ManifestError, ShardManifest
from ringflow.training.sharding import plan_rows, read_partition, write_shards
from ringflow.training.store import LocalFolderStore


def test_plan_is_deterministic_whole_batches_and_complete():
    parts, eval_rows, remainder, batches = plan_rows(1000, 3, 32, 0.1, seed=7)
    again = plan_rows(1000, 3, 32, 0.1, seed=7)
    assert all((a == b).all() for a, b in zip(parts, again[0]))
    assert all(len(p) == batches * 32 for p in parts)
    everything = np.concatenate(parts + [eval_rows])
    assert sorted(everything) == list(range(1000))  # nothing lost, nothing twice
    assert remainder == 900 - 3 * 32 * batches
    other_seed = plan_rows(1000, 3, 32, 0.1, seed=8)[0]
    assert not (other_seed[0] == parts[0]).all()


def test_too_little_data_says_what_to_change():
    with pytest.raises(ManifestError, match="lower batch_size"):
        plan_rows(50, 2, 32, 0.2, seed=0)


def test_write_shards_roundtrip_and_rerun_rewrites_nothing(tmp_path):
    df = load_builtin("digits")
    store = LocalFolderStore(str(tmp_path / "shards"))
    manifest = write_shards(df, store, target="target", num_partitions=2, batch_size=32, seed=1)
    assert manifest.schema.task == "classification" and manifest.schema.num_classes == 10
    assert ShardManifest.from_json(store.get_bytes("manifest.json")) == manifest
    total = sum(p.rows for p in manifest.partitions) + manifest.eval.rows
    assert total == len(df)
    part = read_partition(store, manifest.partitions[1])
    assert len(part) == manifest.partitions[1].rows and len(part) % 32 == 0
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "shards").iterdir()}
    assert write_shards(df, store, target="target", num_partitions=2, batch_size=32, seed=1) == manifest
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "shards").iterdir()} == mtimes
    with pytest.raises(ManifestError, match="new location"):
        write_shards(df, store, target="target", num_partitions=3, batch_size=32, seed=1)


def test_tampered_partition_is_refused(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(load_builtin("wine"), store, target="target", num_partitions=2, batch_size=8)
    data = bytearray(store.get_bytes("part-00000.parquet"))
    data[-20] ^= 0xFF
    store.put_bytes("part-00000.parquet", bytes(data))
    with pytest.raises(ManifestError, match="checksum"):
        read_partition(store, manifest.partitions[0])


def test_regression_and_bad_columns(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(load_builtin("diabetes"), store, target="target", num_partitions=2, batch_size=16)
    assert manifest.schema.task == "regression" and manifest.schema.num_outputs == 1
    with pytest.raises(ManifestError, match="not in the dataset"):
        write_shards(pd.DataFrame({"a": [1.0]}), LocalFolderStore(str(tmp_path / "x")), target="y",
                     num_partitions=1, batch_size=1)
    with pytest.raises(ManifestError, match="not numeric"):
        write_shards(pd.DataFrame({"a": ["x"] * 10, "y": [1] * 10}), LocalFolderStore(str(tmp_path / "z")),
                     target="y", num_partitions=1, batch_size=1)
