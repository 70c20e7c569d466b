"""health.jsonl and its sealed segments: bounded rewrites, nothing lost or doubled, resume continues."""
from ringflow.training.health.records import HealthLog, read_health, record
from ringflow.training.run_layout import HEALTH
from ringflow.training.store import LocalFolderStore


def log(store, **kwargs):
    return HealthLog(store, flush_seconds=0.0, segment_lines=3, **kwargs)


def test_long_run_seals_segments_and_reads_back_in_order(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    health = log(store)
    for step in range(8):
        health.append(record("step", step=step))
    assert sorted(i.key for i in store.list("health/")) == ["health/000000.jsonl", "health/000001.jsonl"]
    assert len(store.get_bytes(HEALTH).splitlines()) == 2  # the rewrite stays bounded
    records = read_health(store)
    assert [r["step"] for r in records] == list(range(8)) and [r["seq"] for r in records] == list(range(8))


def test_resumed_run_continues_after_the_records_of_the_attempts_before(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    first = log(store)
    for step in range(6):  # ends exactly on a seal: health.jsonl is empty, the last seq is in a segment
        first.append(record("step", step=step))
    second = log(store)
    second.append(record("start"))
    second.append(record("step", step=6))
    records = read_health(store)
    assert [r["seq"] for r in records] == list(range(8)) and records[6]["type"] == "start"


def test_reader_between_seal_and_restart_sees_each_record_once(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    health = log(store)
    for step in range(3):
        health.append(record("step", step=step))
    sealed = store.get_bytes("health/000000.jsonl")
    store.put_bytes(HEALTH, sealed)  # as a reader sees it when health.jsonl has not started over yet
    assert [r["step"] for r in read_health(store)] == [0, 1, 2]


def test_rank_without_the_log_writes_nothing(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    log(store, enabled=False).append(record("step", step=1), force_flush=True)
    assert read_health(store) == [] and not list(store.list())
