import numpy as np
import pandas as pd
import pytest

from ringflow.training.formats.datasets import load_builtin
from ringflow.training.core.input_gate import UntrainableData
from ringflow.training.formats.manifest import ManifestError, ShardManifest
from ringflow.training.core.sharding import ShardPlan, read_partition, shuffled_positions, write_shards
from ringflow.training.store import LocalFolderStore


@pytest.mark.parametrize("num_rows", [1, 2, 3, 17, 1000, 4099])
def test_shuffled_positions_are_a_permutation_fixed_by_the_seed(num_rows):
    rows = np.arange(num_rows)
    positions = shuffled_positions(rows, num_rows, seed=7)
    assert sorted(positions) == list(range(num_rows))  # nothing lost, nothing twice
    assert (positions == shuffled_positions(rows, num_rows, seed=7)).all()
    # Any subset of rows, in any batches, lands where it does in the whole: what lets the shard step stream.
    assert (np.concatenate([shuffled_positions(rows[i:i + 5], num_rows, 7) for i in range(0, num_rows, 5)])
            == positions).all()
    if num_rows >= 17:
        assert not (positions == shuffled_positions(rows, num_rows, seed=8)).all()
        assert not (positions == rows).all()


# (rows, partitions, batch, eval fraction) -> (eval rows drawn, batches per partition, remainder)
PLANS = [
    ((1000, 3, 32, 0.1), (100, 9, 36)),
    ((1797, 2, 32, 0.2), (359, 22, 30)),
    ((64, 2, 32, 0.0), (0, 1, 0)),
    ((100, 1, 7, 0.25), (25, 10, 5)),
]


@pytest.mark.parametrize("args, expected", PLANS)
def test_plan_counts_and_places_every_row_once(args, expected):
    plan = ShardPlan(*args)
    assert (plan.eval_rows, plan.batches, plan.remainder) == expected
    destination, slot = plan.place(shuffled_positions(np.arange(plan.rows), plan.rows, seed=3))
    for d in range(plan.partitions + 1):
        slots = np.sort(slot[destination == d])
        assert (slots == np.arange(plan.destination_rows(d))).all()  # every slot filled exactly once
    assert plan.destination_rows(plan.partitions) == plan.eval_rows + plan.remainder


def test_too_little_data_says_what_to_change():
    with pytest.raises(ManifestError, match="lower batch_size"):
        ShardPlan(50, 2, 32, 0.2)
    with pytest.raises(ManifestError, match="eval_fraction"):
        ShardPlan(50, 2, 32, 1.0)


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
    # The input gate (test_input_gate.py) refuses these before anything is written.
    with pytest.raises(UntrainableData, match="target column 'y' is not in the dataset"):
        write_shards(pd.DataFrame({"a": [1.0]}), LocalFolderStore(str(tmp_path / "x")), target="y",
                     num_partitions=1, batch_size=1)
    with pytest.raises(UntrainableData, match=r"feature column 'a': 10 of 10 rows .* \(10 non-numeric\)"):
        write_shards(pd.DataFrame({"a": ["x"] * 10, "y": [1] * 10}), LocalFolderStore(str(tmp_path / "z")),
                     target="y", num_partitions=1, batch_size=1)
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()


# -- streaming: memory knobs never change the result -------------------------------------------------

def _shas(manifest):
    return [p.sha256 for p in manifest.partitions] + [manifest.eval.sha256]


def test_batch_and_spill_sizes_do_not_change_a_single_byte(tmp_path, monkeypatch):
    from ringflow.training.formats import datasets
    from ringflow.training.core import sharding

    df = load_builtin("digits")
    reference = write_shards(df, LocalFolderStore(str(tmp_path / "a")), target="target", num_partitions=3,
                             batch_size=16, seed=4)
    monkeypatch.setattr(datasets, "BATCH_BYTES", 1)  # 256-row batches (the minimum)
    monkeypatch.setattr(sharding, "SPILL_BUCKET_BYTES", 1)  # a bucket per row group
    small = write_shards(df, LocalFolderStore(str(tmp_path / "b")), target="target", num_partitions=3,
                         batch_size=16, seed=4)
    assert _shas(small) == _shas(reference) and small == reference


def test_partitions_hold_the_planned_rows_in_row_groups_and_stats_of_the_training_rows(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from ringflow.training.core import sharding

    monkeypatch.setattr(sharding, "ROW_GROUP_BYTES", (13 * 4 + 8) * 16 * 3)  # wine: 13 features; 3 minibatches
    df = load_builtin("wine")
    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(df, store, target="target", num_partitions=2, batch_size=16, seed=2, eval_fraction=0.1)
    assert manifest.params["row_group_rows"] == 48
    plan = ShardPlan(len(df), 2, 16, 0.1)
    destination, slot = plan.place(shuffled_positions(np.arange(len(df)), len(df), 2))
    for d, entry in enumerate(manifest.partitions):
        part = pq.ParquetFile(store.root / entry.key)
        assert [part.metadata.row_group(g).num_rows for g in range(part.num_row_groups)] == [48, 32]
        expected = df.iloc[np.flatnonzero(destination == d)[np.argsort(slot[destination == d])]]
        got = part.read().to_pandas()
        assert np.allclose(got["alcohol"], expected["alcohol"].astype(np.float32))
        assert (got["target"].to_numpy() == expected["target"].to_numpy()).all()
    training = df.iloc[np.flatnonzero(destination < 2)]
    assert np.allclose(manifest.schema.feature_mean, training.drop(columns="target").mean().to_numpy(), rtol=1e-5)
    assert np.allclose(manifest.schema.feature_std, training.drop(columns="target").std(ddof=0).to_numpy(), rtol=1e-4)


def test_a_manifest_from_before_v4_is_refused_saying_to_reshard(tmp_path):
    """v1-v3 came before the first release: such a manifest is refused with what to do, and shards of one in
    the place the shard step writes to are not mixed with new ones."""
    import json

    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(load_builtin("wine"), store, target="target", num_partitions=2, batch_size=8)
    doc = json.loads(manifest.to_json())
    doc["format"] = "ringflow.shards/v3"
    with pytest.raises(ManifestError, match=r"format is 'ringflow.shards/v3', not 'ringflow.shards/v4': re-shard "
                                            r"the dataset with this ringflow \(`ringflow shard` / the shard task\)"):
        ShardManifest.from_json(json.dumps(doc))
    store.put_bytes("manifest.json", json.dumps(doc).encode())
    with pytest.raises(ManifestError, match="holds shards this ringflow cannot read.*shard into a new location"):
        write_shards(load_builtin("wine"), store, target="target", num_partitions=2, batch_size=8)


def test_column_groups_and_fewer_writers_do_not_change_a_single_byte(tmp_path, monkeypatch):
    """A wide Parquet input is scanned one column group per pass, and the writers are as many as the memory
    left allows: neither may change the shards. A tensor column and the target each in a group of their own."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ringflow.training.formats import datasets
    from ringflow.training.core import sharding
    from ringflow.training.formats.datasets import builtin_table, open_dataset

    table = builtin_table("digits_images")
    table = table.append_column("brightness", pa.array(np.arange(len(table), dtype=np.float64) / 7))
    pq.write_table(table, tmp_path / "images.parquet", row_group_size=500)

    def shard_into(name):
        with open_dataset(str(tmp_path / "images.parquet")) as dataset:
            return write_shards(dataset, LocalFolderStore(str(tmp_path / name)), target="target", num_partitions=3,
                                batch_size=16, seed=4)

    reference = shard_into("one-pass")
    monkeypatch.setattr(datasets, "READ_BYTES", 1)  # one pass per column
    monkeypatch.setattr(sharding, "available_memory", lambda: 0)  # one writer
    grouped = shard_into("per-column")
    assert grouped == reference and _shas(grouped) == _shas(reference)
    assert sorted(p.name for p in (tmp_path / "per-column").iterdir()) == sorted(
        p.name for p in (tmp_path / "one-pass").iterdir())
