"""A stream of at most one shuffle window, or of few decoded bytes (partition_batches.KEEP_DECODED_BYTES), is
decoded once and kept (data.PartitionData): every epoch serves exactly what streaming it would, and a larger
stream still streams. The next epoch's first
window loads while an epoch's last one is served."""
import pytest
import torch

from ringflow.training.rank import data as data_module
from ringflow.training.rank import partition_batches
from ringflow.training.core import sharding
from ringflow.training.rank.data import Cursor, PartitionData
from ringflow.training.formats.datasets import load_builtin
from ringflow.training.core.sharding import write_shards
from ringflow.training.store import LocalFolderStore


@pytest.fixture()
def digits_in_small_row_groups(tmp_path, monkeypatch):
    """Digits in two files of 22 row groups of 32 rows each (as in test_data.py): a stream of 44 row groups."""
    monkeypatch.setattr(sharding, "ROW_GROUP_BYTES", (64 * 4 + 8) * 32)
    store = LocalFolderStore(str(tmp_path))
    return store, write_shards(load_builtin("digits"), store, target="target", num_partitions=2, batch_size=16)


def served(data, epoch, batch=0):
    out = [(b, x, y) for b, x, y in data.batches(seed=7, cursor=Cursor(epoch, batch))]
    data._loader.submit(lambda: None).result()  # the loader thread is idle: what it was asked to load is loaded
    return out


def same(a, b):
    return [i for i, _, _ in a] == [i for i, _, _ in b] and all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (_, xa, ya), (_, xb, yb) in zip(a, b))


def test_a_partition_of_one_window_is_decoded_once_and_serves_what_streaming_does(digits_in_small_row_groups,
                                                                                 monkeypatch):
    store, manifest = digits_in_small_row_groups
    decodes = []
    real = data_module.to_tensors
    monkeypatch.setattr(data_module, "to_tensors", lambda table, schema: (decodes.append(len(table)), real(table, schema))[1])
    kept = PartitionData(store, manifest, rank=1, world_size=2, batch_size=16, window=44)
    streamed = PartitionData(store, manifest, rank=1, world_size=2, batch_size=16, window=44)
    streamed._keep_decoded = False  # the same windows, decoded from Parquet each time
    runs = [(epoch, batch, served(kept, epoch, batch)) for epoch, batch in ((0, 0), (1, 0), (2, 5))]  # a resume too
    assert len(decodes) == 1  # the whole stream, once
    for epoch, batch, a in runs:
        b = served(streamed, epoch, batch)
        assert [i for i, _, _ in a] == list(range(batch, kept.batches_per_epoch)) == [i for i, _, _ in b]
        assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (_, xa, ya), (_, xb, yb) in zip(a, b))
    # streamed: its one window every epoch, and the next epoch's ahead; the ahead of epoch 2 holds this rank's rows
    # from the epoch's start, so the resume at batch 5 loads its own
    assert len(decodes) == 1 + 5
    assert not torch.equal(runs[0][2][0][1], runs[1][2][0][1])  # each epoch its own order


def test_a_small_stream_of_many_windows_is_decoded_once(digits_in_small_row_groups, monkeypatch):
    """44 row groups, 11 windows of 4, but 1,437 rows of 264 bytes: under KEEP_DECODED_BYTES, kept."""
    store, manifest = digits_in_small_row_groups
    decodes = []
    real = data_module.to_tensors
    monkeypatch.setattr(data_module, "to_tensors", lambda table, schema: (decodes.append(len(table)), real(table, schema))[1])
    kept = PartitionData(store, manifest, rank=0, world_size=2, batch_size=16, window=4)
    assert kept._keep_decoded
    runs = [served(kept, epoch) for epoch in range(3)]
    assert decodes == [kept.stream_rows]  # the whole stream, once
    monkeypatch.setattr(partition_batches, "KEEP_DECODED_BYTES", 0)
    streamed = PartitionData(store, manifest, rank=0, world_size=2, batch_size=16, window=4)
    assert not streamed._keep_decoded
    assert all(same(run, served(streamed, epoch)) for epoch, run in enumerate(runs))


def test_a_partition_larger_than_a_window_streams_and_loads_the_next_epoch_ahead(digits_in_small_row_groups,
                                                                                   monkeypatch):
    monkeypatch.setattr(partition_batches, "KEEP_DECODED_BYTES", 0)  # a stream too large to keep decoded
    store, manifest = digits_in_small_row_groups
    data = PartitionData(store, manifest, rank=0, world_size=2, batch_size=16, window=4)
    decodes = []
    real = data_module.to_tensors
    monkeypatch.setattr(data_module, "to_tensors", lambda table, schema: (decodes.append(len(table)), real(table, schema))[1])
    first = served(data, 0)
    assert len(decodes) == 6 + 1 and max(decodes) <= 4 * 32  # 22 row groups: 6 windows of at most 4; epoch 1's first
    second = served(data, 1)  # starts with the window loaded ahead
    assert len(decodes) == 2 * 6 + 1
    fresh = PartitionData(store, manifest, rank=0, world_size=2, batch_size=16, window=4)
    assert same(second, served(fresh, 1)) and same(first, served(fresh, 0)) and not same(first, second)
    assert same(served(data, 1, 3), served(fresh, 1, 3))  # a resumed cursor: no window was loaded ahead for it
