"""A user script's share of the dataset (rank/script_data.py's DatasetShard over partition_batches.py): epochs
from the cursor on, the cursor after each batch, its settled form for a checkpoint, and a resume from it (on
another world size) serving exactly the rows not yet trained."""
import numpy as np
import pandas as pd
import pytest

from ringflow.training.core.sharding import write_shards
from ringflow.training.rank.partition_batches import Cursor, PartitionBatches
from ringflow.training.rank.script_data import DatasetShard
from ringflow.training.store import LocalFolderStore

ROWS, BATCH, SEED = 60, 4, 7


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    frame = pd.DataFrame({"a": np.arange(ROWS, dtype=np.float32), "b": np.ones(ROWS, dtype=np.float32),
                          "target": np.arange(ROWS) % 3})
    store = LocalFolderStore(str(tmp_path_factory.mktemp("small-shards")))
    return store, write_shards(frame, store, target="target", num_partitions=2, batch_size=BATCH)


def shard(shards, rank=0, world_size=2, epochs=2, cursor=Cursor()) -> DatasetShard:
    store, manifest = shards
    return DatasetShard(PartitionBatches(store, manifest, rank, world_size, BATCH), SEED, epochs, cursor, "numpy")


def all_rows(shards) -> list[tuple[int, int]]:
    _, manifest = shards
    return sorted((f, r) for f, p in enumerate(manifest.partitions) for r in range(sum(g.rows for g in p.row_groups)))


def test_epochs_and_the_cursor_after_each_batch(shards):
    data = shard(shards)
    per_epoch = data.batches_per_epoch
    assert data.rows * 2 == len(all_rows(shards)) and per_epoch == -(-data.rows // BATCH)
    seen = []
    for epoch in data.epochs():
        for i, (x, y) in enumerate(data):
            assert data.cursor == Cursor(epoch, i + 1) and len(x) == len(y) == len(data.row_ids)
            assert x.shape[1] == data.schema.num_features == 2
            seen.append((epoch, i))
        assert data.cursor == Cursor(epoch + 1)
    assert seen == [(e, i) for e in range(2) for i in range(per_epoch)]
    assert list(data.epochs()) == []  # trained out


def test_leaving_an_epoch_early_moves_to_the_next_epochs_start(shards):
    data = shard(shards)
    epochs = data.epochs()
    assert next(epochs) == 0
    next(iter(data))
    assert data.cursor == Cursor(0, 1)
    assert next(epochs) == 1 and data.cursor == Cursor(1)


def test_settled_names_the_unseen_rows_and_the_next_epoch_at_its_end(shards):
    data = shard(shards)
    assert data.settled() == Cursor()
    batches = iter(data)
    next(batches)
    settled = data.settled()
    assert (settled.epoch, settled.batch) == (0, 0) and settled.remaining is not None
    for _ in batches:
        pass
    assert data.settled() == Cursor(1)


def rows_of_epoch(data: DatasetShard) -> list[tuple[int, int]]:
    rows = []
    for _ in data:
        rows += [tuple(r) for r in data.row_ids.tolist()]
    return rows


@pytest.mark.parametrize("taken, world_size", [(1, 2), (3, 1), (2, 3)])
def test_a_resume_from_the_settled_cursor_serves_exactly_the_rows_not_trained(shards, taken, world_size):
    """Both ranks take `taken` batches; a checkpoint then holds rank 0's settled cursor; `world_size` ranks
    resumed from it train every row of the epoch not trained yet, once."""
    ranks = [shard(shards, rank) for rank in range(2)]
    trained = []
    for data in ranks:
        batches = iter(data)
        for _ in range(taken):
            next(batches)
            trained += [tuple(r) for r in data.row_ids.tolist()]
    settled = ranks[0].settled()
    assert settled == ranks[1].settled()
    resumed = [shard(shards, rank, world_size, cursor=settled) for rank in range(world_size)]
    rest = [row for data in resumed for row in rows_of_epoch(data)]
    assert len(trained) + len(rest) == len(set(trained + rest)) and sorted(trained + rest) == all_rows(shards)
    assert all(data.cursor == Cursor(1) for data in resumed)
