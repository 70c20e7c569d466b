"""A rank's stream of the shards: the epoch order is a pure function of (row groups, seed, epoch), a cursor
resumes at any minibatch (also inside a shuffle window, and across two), each row group is read by its byte
range and checked, and tensor columns keep their shape. (The stream dealt to any world size:
test_global_stream.py.)"""
import numpy as np
import pytest
import torch

from ringflow.training.core import sharding
from ringflow.training.rank.data import Cursor, PartitionData, epoch_order, epoch_windows
from ringflow.training.formats.datasets import builtin_table, load_builtin
from ringflow.training.core.sharding import write_shards
from ringflow.training.store import LocalFolderStore


def test_epoch_order_depends_on_seed_and_epoch_only():
    a = epoch_order(100, seed=3, epoch=2)
    assert (a == epoch_order(100, seed=3, epoch=2)).all()
    assert not (a == epoch_order(100, seed=3, epoch=3)).all()
    assert not (a == epoch_order(100, seed=4, epoch=2)).all()
    assert sorted(a) == list(range(100))


# (row groups, window) -> windows per epoch
WINDOWS = [([10] * 8, 4, 2), ([10] * 9, 4, 3), ([5, 7, 3], 1, 3), ([64], 4, 1)]


@pytest.mark.parametrize("groups, window, count", WINDOWS)
def test_windows_cover_every_row_once_and_the_order_stays_inside_a_window(groups, window, count):
    windows = epoch_windows(groups, seed=1, epoch=0, window=window)
    assert len(windows) == count
    assert sorted(g for w in windows for g in w.groups) == list(range(len(groups)))
    assert [w.start for w in windows] == list(np.cumsum([0] + [w.rows for w in windows])[:-1])
    order = epoch_order(groups, seed=1, epoch=0, window=window)
    assert sorted(order) == list(range(sum(groups)))
    first = np.concatenate([[0], np.cumsum(groups)[:-1]])
    for w in windows:  # a window serves exactly the rows of its row groups: the shuffle buffer is bounded
        rows = set(order[w.start:w.start + w.rows])
        assert rows == {r for g in w.groups for r in range(first[g], first[g] + groups[g])}


@pytest.fixture()
def small_row_groups(monkeypatch):
    """Row groups of 2 minibatches of 16 digits rows, so a partition has many and windows are small."""
    monkeypatch.setattr(sharding, "ROW_GROUP_BYTES", (64 * 4 + 8) * 32)  # 64 float32 pixels + an int64 label


@pytest.mark.parametrize("window", [1, 3])
def test_resuming_from_a_cursor_neither_repeats_nor_skips(tmp_path, small_row_groups, window):
    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(load_builtin("digits"), store, target="target", num_partitions=2, batch_size=16)
    assert manifest.params["row_group_rows"] == 32
    data = PartitionData(store, manifest, rank=1, world_size=2, batch_size=16, window=window)
    assert len(data.group_rows) == 44 and len(data) == data.rows == 704
    full = [(b, x, y) for b, x, y in data.batches(seed=5, cursor=Cursor(1, 0))]
    assert [b for b, _, _ in full] == list(range(data.batches_per_epoch))
    for cut in (1, 2, 7, 43):  # inside a row group, at its edge, inside a window, the last batch
        after = list(data.batches(seed=5, cursor=Cursor(1, cut)))
        assert [b for b, _, _ in after] == list(range(cut, data.batches_per_epoch))
        assert all(torch.equal(x, fx) and torch.equal(y, fy) for (_, x, y), (_, fx, fy) in zip(after, full[cut:]))
    seen = torch.cat([x for _, x, _ in full])
    rows = {tuple(np.round(r.numpy(), 5)) for r in seen}
    assert len(seen) == data.batches_per_epoch * 16
    assert len(rows) >= len(seen) - 5  # digits has a few duplicate images; no row is served twice by us
    other_epoch = torch.cat([x for _, x, _ in data.batches(seed=5, cursor=Cursor(2, 0))])
    assert not torch.equal(other_epoch, seen)


def test_a_batch_size_that_does_not_divide_the_row_groups_spans_windows(tmp_path, small_row_groups):
    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(load_builtin("digits"), store, target="target", num_partitions=2, batch_size=16)
    data = PartitionData(store, manifest, rank=0, world_size=1, batch_size=24, window=1)
    served = [(b, x) for b, x, _ in data.batches(seed=0, cursor=Cursor(0, 0))]
    assert [len(x) for _, x in served] == [24] * (1408 // 24) + [1408 % 24]  # the last one partial
    resumed = [(b, x) for b, x, _ in data.batches(seed=0, cursor=Cursor(0, 5))]  # batch 5 spans two groups
    assert all(torch.equal(x, fx) for (_, x), (_, fx) in zip(resumed, served[5:]))


@pytest.mark.parametrize("batch_size, window", [(16, 4), (24, 1), (80, 1), (80, 44)])
def test_each_batch_is_the_epoch_order_s_rows(tmp_path, small_row_groups, batch_size, window):
    """Rows 32 to a row group: batches inside a window, across two, across three (a batch larger than a
    window), and a stream kept decoded (44 groups in one window): the rows epoch_order names, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ringflow.training.rank.data import to_tensors

    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(load_builtin("digits"), store, target="target", num_partitions=2, batch_size=16)
    data = PartitionData(store, manifest, rank=0, world_size=1, batch_size=batch_size, window=window)
    x_all, y_all = to_tensors(pa.concat_tables([pq.read_table(store.root / p.key) for p in manifest.partitions]),
                              data.schema)  # block order: file by file
    order = torch.from_numpy(epoch_order(data.group_rows, seed=3, epoch=1, window=window))
    for start in (0, 3):  # from the epoch's start, and resumed inside it
        served = list(data.batches(seed=3, cursor=Cursor(1, start)))
        assert [b for b, _, _ in served] == list(range(start, data.batches_per_epoch))
        for b, x, y in served:
            rows = order[b * batch_size:(b + 1) * batch_size]
            assert torch.equal(x, x_all[rows]) and torch.equal(y, y_all[rows])


def test_image_columns_reach_the_model_in_their_shape(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(builtin_table("digits_images"), store, target="target", num_partitions=2,
                            batch_size=16)
    assert manifest.schema.input_shape == (1, 8, 8) and manifest.schema.num_features == 64
    image, target = manifest.schema.columns
    assert (image.name, image.shape, image.dtype) == ("image", (1, 8, 8), "float32")
    assert (target.name, target.shape, target.dtype) == ("target", (), "int64")
    data = PartitionData(store, manifest, rank=0, world_size=2, batch_size=16)
    _, x, y = next(data.batches(seed=0, cursor=Cursor()))
    assert x.shape == (16, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    # One mean and std over all of the image's elements (the training rows'), so x is about standardized.
    everything = torch.cat([x for _, x, _ in data.batches(seed=0, cursor=Cursor())])
    assert abs(float(everything.mean())) < 0.1 and abs(float(everything.std()) - 1) < 0.1


def test_prefetch_loads_the_next_window_while_this_one_is_served(tmp_path, small_row_groups, monkeypatch):
    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(load_builtin("digits"), store, target="target", num_partitions=2, batch_size=16)
    data = PartitionData(store, manifest, rank=0, world_size=2, batch_size=16, window=2)
    loaded = []
    real = data._load
    monkeypatch.setattr(data, "_load", lambda w, op, spans: (loaded.append(w.groups), real(w, op, spans))[1])
    batches = data.batches(seed=0, cursor=Cursor())
    next(batches)  # the first window is being served: the second one is already asked for
    data._loader.submit(lambda: None).result()  # wait until the loader thread is idle
    assert len(loaded) == 2


class RangesOnly:
    """A store that serves ranged reads alone, counting their bytes: a rank must not download its partition."""

    def __init__(self, inner):
        self.inner, self.uri, self.ranges = inner, "s3://test/shards", []

    def get_range(self, key, start, length, progress=None):
        self.ranges.append((key, start, length))
        return self.inner.get_range(key, start, length, progress=progress)


def test_the_stream_is_read_by_ranges_each_checked_and_nothing_is_downloaded(tmp_path, small_row_groups):
    inner = LocalFolderStore(str(tmp_path / "s"))
    manifest = write_shards(load_builtin("digits"), inner, target="target", num_partitions=2, batch_size=16)
    assert [len(p.row_groups) for p in manifest.partitions] == [22, 22]
    store = RangesOnly(inner)
    data = PartitionData(store, manifest, rank=0, world_size=1, batch_size=16, window=4)
    served = list(data.batches(seed=0, cursor=Cursor()))
    assert len(served) == data.batches_per_epoch
    footers = sorted((p.key, p.footer.offset, p.footer.length) for p in manifest.partitions)
    assert sorted(r for r in store.ranges if r in footers) == footers  # each file's footer, once
    groups = [r for r in store.ranges if r not in footers]
    assert set(groups) == {(p.key, g.offset, g.length) for p in manifest.partitions for g in p.row_groups}
    assert len(groups) <= 44 + 4  # each row group once, and the next epoch's first window loaded ahead


def test_a_row_group_changed_after_sharding_is_refused_when_it_arrives(tmp_path, small_row_groups):
    from ringflow.training.formats.manifest import ManifestError

    store = LocalFolderStore(str(tmp_path))
    manifest = write_shards(load_builtin("digits"), store, target="target", num_partitions=2, batch_size=16)
    group = manifest.partitions[0].row_groups[5]
    path = store.root / manifest.partitions[0].key
    raw = bytearray(path.read_bytes())
    raw[group.offset + 10] ^= 0xFF
    path.write_bytes(bytes(raw))
    data = PartitionData(store, manifest, rank=0, world_size=1, batch_size=16, window=4)
    with pytest.raises(ManifestError, match="row group 5 of partition 'part-00000.parquet' fails its checksum"):
        list(data.batches(seed=0, cursor=Cursor()))

