"""The ranges a rank read, kept on its host for the workers torchrun restarts (rank/host_ranges.py): read back by
any rank and checked, the last reads and the pinned commits kept and the rest deleted, a restarted rank taking
over its rank's folder, the host's copy of the state first (keeping pauses on a full memory disk, stops when the
copy gave way); and a reader restarted at a commit's cursor reads its first windows from the host, not from the
store (partition_batches.PartitionBatches.first_ranges)."""
import os

import pytest

from ringflow.training.core import sharding
from ringflow.training.core.sharding import write_shards
from ringflow.training.formats.datasets import load_builtin
from ringflow.training.formats.manifest import ByteRange, sha256_hex
from ringflow.training.rank import host_ranges, partition_batches
from ringflow.training.rank.data import Cursor, PartitionData
from ringflow.training.rank.host_ranges import GIVEN_WAY, PINNED_COMMITS, HostRanges, give_way, rank_folder
from ringflow.training.rank.partition_batches import WINDOWS_HELD
from ringflow.training.store import LocalFolderStore

BATCH = 16


def ranged(data: bytes) -> ByteRange:
    return ByteRange(0, len(data), sha256_hex(data))


def kept(tmp_path, rank, **kwargs):
    return HostRanges(str(tmp_path), rank, WINDOWS_HELD, **kwargs)


def held(folder, rank):
    return {name for name in os.listdir(rank_folder(folder, rank)) if not name.startswith(".")}


def test_a_range_kept_by_one_rank_is_read_back_by_another_and_checked(tmp_path):
    a, b = ranged(b"row group a"), ranged(b"row group b")
    kept(tmp_path, 0).keep([(a, b"row group a"), (b, b"row group b")])
    other = kept(tmp_path, 1)
    assert other.get(a) == b"row group a" and other.get(b) == b"row group b"
    assert other.hit_bytes == len(b"row group a") + len(b"row group b")
    (tmp_path / "ranges" / "rank-0" / a.sha256).write_bytes(b"row group A")  # changed on the host
    assert other.get(a) is None
    assert other.get(ranged(b"never read")) is None


def test_what_is_not_a_regular_file_of_the_range_s_length_is_never_read(tmp_path):
    wanted = ranged(b"row group a")
    folder = tmp_path / "ranges" / "rank-0"
    folder.mkdir(parents=True)
    os.mkfifo(folder / wanted.sha256)  # would block a plain open
    assert kept(tmp_path, 1).get(wanted) is None
    (folder / wanted.sha256).unlink()
    (folder / wanted.sha256).symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"row group a")
    assert kept(tmp_path, 1).get(wanted) is None


def test_the_last_reads_and_the_pinned_commits_are_kept_the_rest_deleted(tmp_path):
    ranges = kept(tmp_path, 0)
    reads = [ranged(f"window {i}".encode()) for i in range(WINDOWS_HELD + 3)]
    ranges.keep([(reads[0], b"window 0")])
    ranges.pin([reads[0], reads[1]])  # a commit whose first windows are 0 and 1 (1 not read yet)
    for i in range(1, WINDOWS_HELD + 1):
        ranges.keep([(reads[i], f"window {i}".encode())])
    assert held(tmp_path, 0) == {r.sha256 for r in reads[:WINDOWS_HELD + 1]}  # 0 pinned, beside the last reads
    for _ in range(PINNED_COMMITS):
        ranges.pin([reads[WINDOWS_HELD]])
    assert held(tmp_path, 0) == {r.sha256 for r in reads[1:WINDOWS_HELD + 1]}  # the old pin dropped


def test_a_restarted_rank_takes_over_its_folder_until_its_own_commits_pin_theirs(tmp_path):
    windows = [ranged(f"window {i}".encode()) for i in range(3)]
    kept(tmp_path, 1).keep([(windows[0], b"window 0"), (windows[1], b"window 1")])
    (tmp_path / "ranges" / "rank-1" / f".{windows[2].sha256}.tmp").write_bytes(b"a write cut short")
    restarted = kept(tmp_path, 1)
    assert not any(name.endswith(".tmp") for name in os.listdir(rank_folder(tmp_path, 1)))
    restarted.keep([(windows[2], b"window 2")])
    assert restarted.get(windows[1]) == b"window 1" and held(tmp_path, 1) == {r.sha256 for r in windows}
    for _ in range(PINNED_COMMITS):
        restarted.pin([windows[2]])
    assert held(tmp_path, 1) == {windows[2].sha256}


def test_a_full_disk_stops_this_rank_s_keeping_once_and_reads_go_on(tmp_path):
    said = []
    (tmp_path / "ranges").mkdir()
    (tmp_path / "ranges" / "rank-0").write_bytes(b"")  # not a folder: every write fails (not as a full disk)
    ranges = kept(tmp_path, 0, say=said.append)
    ranges.keep([(ranged(b"a"), b"a")])
    assert ranges.writing and said == []  # a write that failed for another reason: only that one
    real_open = open

    def full(path, mode="r", *args, **kwargs):
        if "w" in mode and "rank-2" in str(path):
            raise OSError(28, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    full_disk = kept(tmp_path, 2, say=said.append)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("builtins.open", full)
        full_disk.keep([(ranged(b"b"), b"b"), (ranged(b"c"), b"c")])
        full_disk.keep([(ranged(b"d"), b"d")])
    assert not full_disk.writing and len(said) == 1 and "No space left" in said[0] and "through the store" in said[0]
    kept(tmp_path, 1).keep([(ranged(b"e"), b"e")])
    assert full_disk.get(ranged(b"e")) == b"e"


def test_keeping_pauses_while_the_memory_disk_is_down_to_its_floor(tmp_path, monkeypatch):
    assert host_ranges.free_floor(4 * 2**20) == 2**20 and host_ranges.free_floor(64 * 2**30) == 2**30
    said, free = [], [0.2]

    class Disk:
        f_frsize, f_blocks = 4096, 1000

        @property
        def f_bavail(self):
            return int(free[0] * self.f_blocks)

    monkeypatch.setattr(host_ranges.os, "statvfs", lambda path: Disk())
    ranges = kept(tmp_path, 0, say=said.append)
    ranges.keep([(ranged(b"a"), b"a")])
    assert not os.path.exists(rank_folder(tmp_path, 0)) and len(said) == 1 and "down to 1 MiB free" in said[0]
    free[0] = 0.9
    ranges.keep([(ranged(b"b"), b"b")])
    assert held(tmp_path, 0) == {ranged(b"b").sha256} and len(said) == 1


def test_once_the_host_s_copy_gave_way_no_rank_keeps_ranges(tmp_path):
    said = []
    ranges = kept(tmp_path, 0, say=said.append)
    ranges.keep([(ranged(b"a"), b"a")])
    give_way(str(tmp_path))  # the copy's write failed: every rank's ranges go
    assert os.listdir(tmp_path / "ranges") == [GIVEN_WAY]
    ranges.keep([(ranged(b"b"), b"b")])
    kept(tmp_path, 1).keep([(ranged(b"c"), b"c")])
    assert os.listdir(tmp_path / "ranges") == [GIVEN_WAY] and len(said) == 1 and "memory disk" in said[0]


def test_a_name_that_is_not_a_sha256_is_never_a_path(tmp_path):
    ranges = kept(tmp_path, 0)
    escape = ByteRange(0, 1, "../../escape")
    ranges.keep([(escape, b"x")])
    assert ranges.get(escape) is None and not (tmp_path / "escape").exists() and not (tmp_path / "ranges").exists()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Digits in 3 files of row groups of 32 rows (45 blocks)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sharding, "ROW_GROUP_BYTES", (64 * 4 + 8) * 32)
        store = LocalFolderStore(str(tmp_path_factory.mktemp("host-ranges")))
        manifest = write_shards(load_builtin("digits"), store, target="target", num_partitions=3, batch_size=BATCH)
    return store, manifest


class CountingStore:
    def __init__(self, inner):
        self.inner, self.uri, self.reads = inner, "s3://test/shards", set()  # the sha256 of each range read

    def get_range(self, key, start, length, progress=None):
        data = self.inner.get_range(key, start, length, progress=progress)
        self.reads.add(sha256_hex(data))
        return data


def served(data, cursor, count, seed=5):
    out = []
    for _, x, y in data.batches(seed, cursor):
        out.append((x.clone(), y.clone(), data.row_ids.copy()))
        if len(out) == count:
            return out
    return out


def test_a_reader_restarted_at_a_commit_reads_its_first_windows_from_the_host(shards, tmp_path, monkeypatch):
    monkeypatch.setattr(partition_batches, "KEEP_DECODED_BYTES", 0)  # streamed, window by window
    store, manifest = shards
    commit_at = Cursor(0, 9)  # 144 rows into rank 1's run of 2: inside its third window
    before = PartitionData(CountingStore(store), manifest, rank=1, world_size=2, batch_size=BATCH, window=4,
                           host_ranges=kept(tmp_path, 1))
    before_ranges = before._host_ranges
    for i, _ in enumerate(before.batches(5, Cursor(0))):
        if i + 1 == commit_at.batch:
            before_ranges.pin(before.first_ranges(5, commit_at))  # the commit, as ddp_elastic's does
        if i == commit_at.batch + 12:  # 12 steps past the commit, two windows on: the worker dies
            break
    before.close()
    pinned = before.first_ranges(5, commit_at)
    assert len([r for r in pinned if r.rows]) == 8  # two windows of 4 row groups, and their files' footers
    assert {r.sha256 for r in pinned} <= held(tmp_path, 1)

    counting = CountingStore(store)
    restarted = PartitionData(counting, manifest, rank=1, world_size=2, batch_size=BATCH, window=4,
                              host_ranges=kept(tmp_path, 1))
    first = served(restarted, commit_at, 8)  # the two pinned windows' micro-batches (8 of 16 rows in 128)
    # None of them through the store (the loader read only the window after them), each from the host once.
    assert not counting.reads & {r.sha256 for r in pinned} and restarted._host_ranges.hit_bytes == sum(r.length for r in pinned)
    plain = served(PartitionData(store, manifest, rank=1, world_size=2, batch_size=BATCH, window=4), commit_at, 8)
    for (x, y, ids), (px, py, pids) in zip(first, plain, strict=True):
        assert (ids == pids).all() and (x == px).all() and (y == py).all()
    restarted.close()
