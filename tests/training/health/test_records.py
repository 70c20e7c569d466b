"""health.jsonl and its sealed segments: bounded rewrites, nothing lost or doubled, resume continues."""
from ringflow.training.health.records import HealthLog, HealthReader, read_health_in, record
from ringflow.training.formats.run_layout import HEALTH
from ringflow.training.store import LocalFolderStore


def log(store, **kwargs):
    return HealthLog(store, flush_seconds=0.0, **({"segment_lines": 3} | kwargs))


def test_long_run_seals_segments_and_reads_back_in_order(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    health = log(store)
    for step in range(8):
        health.append(record("step", step=step))
    assert sorted(i.key for i in store.list("health/")) == ["health/000000.jsonl", "health/000001.jsonl"]
    assert len(store.get_bytes(HEALTH).splitlines()) == 2  # the rewrite stays bounded
    records = read_health_in(store)
    assert [r["step"] for r in records] == list(range(8)) and [r["seq"] for r in records] == list(range(8))


def test_large_records_seal_by_size_before_the_line_count(tmp_path):
    """Step records of a wide job are long: the rewrite of health.jsonl stays bounded in bytes too."""
    store = LocalFolderStore(str(tmp_path))
    health = log(store, segment_lines=1_000, segment_bytes=4_000)
    wide = [0.1] * 200  # one rank's time each: a record of ~1 kB
    for step in range(10):
        health.append(record("step", step=step, step_time=wide))
    segments = sorted(i.key for i in store.list("health/"))
    assert len(segments) == 2 and all(len(store.get_bytes(k)) <= 4_000 + 1_200 for k in segments)
    assert len(store.get_bytes(HEALTH)) < 4_000
    assert [r["step"] for r in read_health_in(store)] == list(range(10))
    # A resumed log counts the bytes already in health.jsonl.
    resumed = log(store, segment_lines=1_000, segment_bytes=4_000)
    for step in range(10, 13):
        resumed.append(record("step", step=step, step_time=wide))
    assert len(sorted(i.key for i in store.list("health/"))) == 3
    assert [r["step"] for r in read_health_in(store)] == list(range(13))


def test_resumed_run_continues_after_the_records_of_the_attempts_before(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    first = log(store)
    for step in range(6):  # ends exactly on a seal: health.jsonl is empty, the last seq is in a segment
        first.append(record("step", step=step))
    second = log(store)
    second.append(record("start"))
    second.append(record("step", step=6))
    records = read_health_in(store)
    assert [r["seq"] for r in records] == list(range(8)) and records[6]["type"] == "start"


def test_read_health_between_seal_and_restart_sees_each_record_once(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    health = log(store)
    for step in range(3):
        health.append(record("step", step=step))
    sealed = store.get_bytes("health/000000.jsonl")
    store.put_bytes(HEALTH, sealed)  # as a reader sees it when health.jsonl has not started over yet
    assert [r["step"] for r in read_health_in(store)] == [0, 1, 2]


def test_rank_without_the_log_writes_nothing(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    log(store, enabled=False).append(record("step", step=1), force_flush=True)
    assert read_health_in(store) == [] and not list(store.list())


class CountingStore(LocalFolderStore):
    """Counts the objects read, to show what a poll costs."""

    def __init__(self, root):
        super().__init__(root)
        self.reads = []

    def get_bytes(self, key):
        self.reads.append(key)
        return super().get_bytes(key)


def test_records_carry_their_attempt(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    log(store, attempt="a1").append(record("start"))
    log(store, attempt="a2").append(record("start"))
    assert [r["attempt"] for r in read_health_in(store)] == ["a1", "a2"]


def test_reader_returns_each_record_once_and_reads_each_segment_once(tmp_path):
    store = CountingStore(str(tmp_path))
    health, reader = log(store), HealthReader()
    seen = []
    for step in range(20):
        health.append(record("step", step=step))
        if step % 4 == 0:
            store.reads.clear()
            seen += reader.poll(store)
            # health.jsonl, the segments sealed since the last poll, and one probe for the next segment
            assert len(store.reads) <= 2 + 2, store.reads
    seen += reader.poll(store)
    assert [r["step"] for r in seen] == list(range(20)) == [r["step"] for r in read_health_in(store)]
    store.reads.clear()
    assert reader.poll(store) == [] and store.reads == [HEALTH, "health/000006.jsonl"]


def test_reader_between_seal_and_restart_sees_each_record_once(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    health, reader = log(store), HealthReader()
    for step in range(3):
        health.append(record("step", step=step))
    store.put_bytes(HEALTH, store.get_bytes("health/000000.jsonl"))  # health.jsonl not started over yet
    assert [r["step"] for r in reader.poll(store)] == [0, 1, 2]
    health.append(record("step", step=3))
    assert [r["step"] for r in reader.poll(store)] == [3]


def test_reader_skips_a_line_cut_short(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    health, reader = log(store, segment_lines=100), HealthReader()
    for step in range(2):
        health.append(record("step", step=step))
    store.put_bytes(HEALTH, store.get_bytes(HEALTH) + b'{"type": "step", "seq": 2, "st')
    assert [r["step"] for r in reader.poll(store)] == [0, 1]
    health.append(record("step", step=2))
    assert [r["step"] for r in reader.poll(store)] == [2]
