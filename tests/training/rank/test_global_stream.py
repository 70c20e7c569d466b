"""A current (v4) manifest's epoch is one stream over every file, dealt to any world size: every training row
once per epoch whatever the number of workers, a settled cursor resumes sample-exact on another number, row ids
name the rows served, and a rank reads only the windows its run touches."""
import concurrent.futures
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ringflow.training.rank import partition_batches
import torch

from ringflow.training.core import sharding
from ringflow.training.core.sharding import write_shards
from ringflow.training.formats.datasets import load_builtin
from ringflow.training.health.progress import Progress
from ringflow.training.rank.data import Cursor, PartitionData, epoch_order, to_tensors
from ringflow.training.store import LocalFolderStore
from ringflow.training.store.base import TransferCancelled

BATCH = 16


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Digits in 3 files of row groups of 32 rows: 1392 training rows (45 blocks), not one per worker."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sharding, "ROW_GROUP_BYTES", (64 * 4 + 8) * 32)
        store = LocalFolderStore(str(tmp_path_factory.mktemp("global-stream")))
        manifest = write_shards(load_builtin("digits"), store, target="target", num_partitions=3, batch_size=16)
    assert manifest.num_partitions == 3
    return store, manifest


def readers(shards, world_size, window=4):
    store, manifest = shards
    return [PartitionData(store, manifest, rank=r, world_size=world_size, batch_size=BATCH, window=window)
            for r in range(world_size)]


def serve(data, cursor, seed=5, count=None):
    """(batch, x, y, row ids) of `count` micro-batches from the cursor (None: to the deal's end)."""
    out = []
    for b, x, y in data.batches(seed, cursor):
        out.append((b, x, y, data.row_ids.copy()))
        if count is not None and len(out) == count:
            break
    return out


def ids_of(served):
    return [tuple(i) for *_, ids in served for i in ids]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_every_training_row_is_served_once_an_epoch_whatever_the_world_size(shards, world_size):
    _, manifest = shards
    ranks = readers(shards, world_size)
    served = [serve(d, Cursor(1)) for d in ranks]
    assert len({len(s) for s in served}) == 1  # the same number of micro-batches on every rank
    seen = [i for s in served for i in ids_of(s)]
    assert len(seen) == len(set(seen)) == manifest.training_rows
    assert {f for f, _ in seen} == {0, 1, 2}
    assert all(len(x) <= BATCH for s in served for _, x, _, _ in s)


def test_the_stream_s_order_is_the_same_for_every_world_size(shards):
    store, manifest = shards
    one = readers(shards, 1)[0]
    order = epoch_order(one.group_rows, seed=5, epoch=1, window=4)  # positions in block order
    first = np.concatenate([[0], np.cumsum(one.group_rows)[:-1]])
    block_of = np.searchsorted(first, order, side="right") - 1
    expected = [(one.blocks[b].file, one.blocks[b].first_row + int(p - first[b])) for b, p in zip(block_of, order)]
    assert ids_of(serve(one, Cursor(1))) == expected
    three = [ids_of(serve(d, Cursor(1))) for d in readers(shards, 3)]
    assert [i for run in three for i in run] == expected  # rank runs are contiguous pieces of the one stream


def test_row_ids_name_the_rows_served(shards):
    store, manifest = shards
    data = readers(shards, 2)[1]
    files = [to_tensors(pq.read_table(store.root / p.key), manifest.schema) for p in manifest.partitions]
    for _, x, y, ids in serve(data, Cursor(0), count=5):
        assert torch.equal(x, torch.stack([files[f][0][r] for f, r in ids]))
        assert torch.equal(y, torch.stack([files[f][1][r] for f, r in ids]))
    x, y, ids = data.minibatch_rows(Cursor(0, 3), seed=5)
    (_, x3, y3, ids3), = serve(data, Cursor(0, 3), count=1)
    assert torch.equal(x, x3) and (ids == ids3).all()
    assert data.row_keys(ids[:1])[0].startswith("part-0000")


@pytest.mark.parametrize("sizes, steps", [([2, 3, 1], [7, 5]), ([3, 2], [4]), ([2, 2], [9])])
def test_a_settled_cursor_resumes_sample_exact_on_another_world_size(shards, sizes, steps):
    """Train `steps[i]` micro-batches on sizes[i] workers, settle the cursor (what a checkpoint stores), deal
    the rest to the next size: every row of the epoch once, and an unchanged size serves what it would have."""
    _, manifest = shards
    cursor, seen = Cursor(2), []
    for world_size, count in zip(sizes, steps + [None]):
        ranks = readers(shards, world_size)
        served = [serve(d, cursor, count=count) for d in ranks]
        seen += [i for s in served for i in ids_of(s)]
        if count is not None:
            settled = ranks[0].settled(Cursor(cursor.epoch, cursor.batch + count, cursor.remaining))
            assert settled.batch == 0 and settled.epoch == 2 and settled == ranks[-1].settled(
                Cursor(cursor.epoch, cursor.batch + count, cursor.remaining))
            if world_size == sizes[sizes.index(world_size) + 1]:  # the same size: the same rows as going on
                going_on = [ids_of(serve(d, Cursor(2, count))) for d in ranks]
                resumed = [ids_of(serve(d, settled)) for d in ranks]
                assert going_on == resumed
            cursor = settled
    assert len(seen) == len(set(seen)) == manifest.training_rows


def test_the_end_of_an_uneven_deal_is_a_partial_then_an_empty_micro_batch(shards):
    """1392 rows on 5 workers: runs of 279 and 278 rows; 17 full micro-batches each, then 7 or 6 rows."""
    assert shards[1].training_rows == 1392
    ranks = readers(shards, 5)
    assert ranks[0].uneven()
    sizes = [[len(x) for _, x, _, _ in serve(d, Cursor(0))] for d in ranks]
    assert sizes == [[16] * 17 + [7]] * 2 + [[16] * 17 + [6]] * 3
    odd = PartitionData(*shards, rank=3, world_size=4, batch_size=BATCH, window=4)
    cursor = Cursor(0, 0, ((0, 4 * 48 + 1),))  # 193 rows: 49, 48, 48, 48 -> the last ranks end with nothing
    assert [len(x) for _, x, _, _ in serve(odd, cursor)] == [16, 16, 16, 0]


class CountingStore:
    """Ranged reads only, counted by file and offset: what a rank reads of the shards."""

    def __init__(self, inner):
        self.inner, self.uri, self.ranges = inner, "s3://test/shards", []

    def get_range(self, key, start, length, progress=None):
        self.ranges.append((key, start))
        return self.inner.get_range(key, start, length, progress=progress)


def test_a_rank_reads_only_the_windows_its_run_touches(shards, monkeypatch):
    monkeypatch.setattr(partition_batches, "KEEP_DECODED_BYTES", 0)  # a stream too large to keep decoded
    store, manifest = shards
    counting = CountingStore(store)
    data = PartitionData(counting, manifest, rank=1, world_size=3, batch_size=BATCH, window=4)
    serve(data, Cursor(0))
    data._loader.submit(lambda: None).result()
    footers = {(p.key, p.footer.offset) for p in manifest.partitions}
    groups = [r for r in counting.ranges if r not in footers]
    # A third of 45 blocks, and at most a window more at each end of the run (plus the next epoch's first window).
    assert len(set(groups)) <= 45 // 3 + 3 * 4
    assert len(groups) == len(set(groups)) or len(groups) - len(set(groups)) <= 4


def test_a_settled_cursor_resumes_sample_exact_with_a_smaller_per_worker_batch(shards):
    """The OOM remedy halves the per-worker batch: the checkpoint's cursor names rows, not micro-batches, so the
    retry (its micro-batches half as large) trains every row of the epoch once; the rows done, which progress
    counts, are the same in either batch."""
    store, manifest = shards
    halves = {size: [PartitionData(store, manifest, rank=r, world_size=2, batch_size=size) for r in range(2)]
              for size in (BATCH, BATCH // 2)}
    before = [serve(d, Cursor(1), count=7) for d in halves[BATCH]]
    settled = halves[BATCH][0].settled(Cursor(1, 7))
    after = [serve(d, settled) for d in halves[BATCH // 2]]
    seen = [i for s in before + after for i in ids_of(s)]
    assert len(seen) == len(set(seen)) == manifest.training_rows
    assert {len(x) for s in after for _, x, _, _ in s[:-1]} == {BATCH // 2}
    done = 2 * 7 * BATCH
    assert halves[BATCH][0].rows_seen(Cursor(1, 7)) == done == halves[BATCH // 2][1].rows_seen(settled)
    assert halves[BATCH][0].epoch_rows == manifest.training_rows


class HeldStore(CountingStore):
    """Ranged reads that wait until released: a store too slow for the training thread to get ahead of."""

    def __init__(self, inner):
        super().__init__(inner)
        self.released = threading.Event()

    def get_range(self, key, start, length, progress=None):
        assert self.released.wait(30)
        return super().get_range(key, start, length, progress=progress)


def test_a_wait_for_a_window_names_the_files_it_reads(shards):
    """What the heartbeat says the rank waits for: the window's read, by file (a window spans files), and
    nothing once it came."""
    store, manifest = shards
    held = HeldStore(store)
    progress = Progress()
    data = PartitionData(held, manifest, rank=0, world_size=1, batch_size=BATCH, window=4, progress=progress)
    first = concurrent.futures.ThreadPoolExecutor(1).submit(
        lambda: (next(iter(data.batches(5, Cursor(0)))), data.row_ids.copy()))
    deadline = time.monotonic() + 10
    while progress.read().waiting is None and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting = progress.read().waiting
    held.released.set()
    (batch, _, _), ids = first.result(30)
    assert batch == 0
    assert waiting is not None and waiting.what.startswith("read of part-") and "row groups" in waiting.what
    served_from = {manifest.partitions[file].key for file in np.unique(ids[:, 0])}
    assert len(served_from) > 1 and all(key in waiting.what for key in served_from), (served_from, waiting.what)
    assert progress.read().waiting is None


class ChunkedStore(CountingStore):
    """Ranged reads that report their bytes a chunk at a time, as the S3 store's do; a read of a row group (not
    a footer) is held after its first chunk until released: row groups in flight."""

    CHUNK = 1024

    def __init__(self, inner, footers):
        super().__init__(inner)
        self.footers, self.released, self.chunks = footers, threading.Event(), {}
        self.held = threading.Semaphore(0)

    def get_range(self, key, start, length, progress=None):
        data = super().get_range(key, start, length)
        for at in range(0, length, self.CHUNK):
            if progress is not None:
                progress(min(self.CHUNK, length - at))
            self.chunks[key, start] = self.chunks.get((key, start), 0) + 1
            if at == 0 and (key, start) not in self.footers:
                self.held.release()
                assert self.released.wait(30)
        return data


def test_a_window_s_row_groups_are_fetched_together_and_closing_abandons_them(shards):
    """A window's row groups are in flight at once (each read waits a request's latency before its first byte),
    and closing the reader (an elastic round's end) abandons every one of them at its next chunk, instead of
    leaving them to share a slow link with the next round's first window, which the survivors wait for."""
    store, manifest = shards
    chunked = ChunkedStore(store, {(p.key, p.footer.offset) for p in manifest.partitions})
    data = PartitionData(chunked, manifest, rank=0, world_size=1, batch_size=BATCH, window=4)
    data.prefetch(5, Cursor(0))
    for _ in range(partition_batches.FETCHES_IN_FLIGHT):  # the first window's 4 row groups, all in flight
        assert chunked.held.acquire(timeout=10)
    data.close()
    chunked.released.set()
    _, pending = data._ahead
    with pytest.raises(TransferCancelled):
        pending.future.result(10)
    groups = {r: n for r, n in chunked.chunks.items() if r not in chunked.footers}
    assert len(groups) == 4 and set(groups.values()) == {1}, groups  # no other read, none past its first chunk


def test_a_reader_closed_while_a_load_submits_its_fetches_cancels_that_load(shards):
    """close() may come while a load is still handing its row groups to the fetch pool, which then refuses the
    rest: that load ends cancelled, as one closed mid-read does, not with the pool's RuntimeError (seen once)."""
    store, manifest = shards
    data = PartitionData(store, manifest, rank=0, world_size=1, batch_size=BATCH, window=4)
    data.close()
    with pytest.raises(TransferCancelled):
        data._read(range(4), lambda nbytes: None)


@pytest.mark.parametrize("cursor", [Cursor(0), Cursor(1, 3)])
def test_a_prefetched_window_is_the_one_served(shards, cursor):
    """A trainer prefetches its cursor's first window once it knows where it resumes; batches() from that
    cursor serves it without reading it again."""
    store, manifest = shards
    counting, plain = CountingStore(store), PartitionData(store, manifest, rank=1, world_size=2, batch_size=BATCH)
    data = PartitionData(counting, manifest, rank=1, world_size=2, batch_size=BATCH)
    data.prefetch(5, cursor)
    data._loader.submit(lambda: None).result(10)
    prefetched = list(counting.ranges)
    served = serve(data, cursor, count=3)
    assert prefetched and counting.ranges[:len(prefetched)] == prefetched
    assert not set(counting.ranges[len(prefetched):]) & set(prefetched)  # the next window's reads only
    expected = serve(plain, cursor, count=3)
    assert all(torch.equal(a[1], b[1]) and np.array_equal(a[3], b[3]) for a, b in zip(served, expected))
