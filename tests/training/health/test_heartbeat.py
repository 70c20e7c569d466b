"""heartbeat.json: what the watcher outside the job reads silence from, and rank 0's writer thread
(liveness.judged_outside's rule is tested in test_liveness.py)."""
import time

import pytest

from ringflow.training.health.heartbeat import (
    ATTEMPT_LINE, ENDED, Heartbeat, HeartbeatWriter, attempt_in_log, read_heartbeat,
)
from ringflow.training.health.progress import Progress
from ringflow.training.health.store_ops import StoreOp
from ringflow.training.store import LocalFolderStore


def beat(written_at, silent, state="running", step=40):
    return Heartbeat("a1", 3, written_at, step, silent, written_at - silent, state)


def test_round_trip_and_garbage(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    assert read_heartbeat(store) is None
    store.put_bytes("heartbeat.json", beat(1.0, 0.5).to_json())
    assert read_heartbeat(store) == beat(1.0, 0.5)
    for raw in (b"{", b"[]", b'{"attempt": "a1"}'):
        assert Heartbeat.from_json(raw) is None


def test_a_heartbeat_of_an_older_ringflow_still_reads():
    """Written before phases, waits and write times were recorded: read with their defaults."""
    old = b'{"attempt": "a1", "seq": 3, "time": 5.0, "step": 4, "silent_seconds": 0.5, "progress_at": 4.5, "state": "running"}'
    beat = Heartbeat.from_json(old)
    assert beat.step == 4 and beat.phase is None and beat.waiting is None and beat.write_seconds == 0.0


def test_the_heartbeat_says_what_the_training_thread_waits_for_and_how_long_writes_take(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    progress = Progress()
    writer = HeartbeatWriter(store, "a1", progress, interval=0.05, stall_seconds=60)
    op = StoreOp("upload of checkpoint ckpt-000000050", "s3://b/run")
    with progress.waiting(op):
        op.moved(1000)
        writer.start()
        time.sleep(0.3)
        beat = read_heartbeat(store)
    writer.stop()
    assert beat.phase == "rendezvous" and beat.step is None
    assert beat.waiting.what == "upload of checkpoint ckpt-000000050" and beat.waiting.bytes == 1000
    assert beat.write_seconds > 0 and read_heartbeat(store).waiting is None


def test_attempt_line_is_found_in_launcher_output():
    line = ATTEMPT_LINE.format(attempt="9f3c0d")
    assert attempt_in_log(line) == "9f3c0d"
    assert attempt_in_log(f"[1,0]<stdout>:{line}") == "9f3c0d"
    assert attempt_in_log(f"[1,0]<stdout>:{line}[1,0]<stdout>:") == "9f3c0d"  # Open MPI 4.1's repeated tag
    assert attempt_in_log("[ringflow] attempting nothing") is None


def test_writer_beats_on_an_interval_and_says_when_it_ended(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    progress = Progress(step=0)
    writer = HeartbeatWriter(store, "a1", progress, interval=0.1, stall_seconds=60)
    writer.start()
    time.sleep(0.35)
    progress.beat(7)
    time.sleep(0.6)
    running = read_heartbeat(store)
    assert running.attempt == "a1" and running.step == 7 and running.state == "running"
    assert running.seq >= 4 and running.silent_seconds < 0.6
    writer.stop()
    assert read_heartbeat(store).state == ENDED and not writer.is_alive()


def test_writer_writes_when_the_silence_passes_the_limit(tmp_path):
    """A hung loop: the heartbeat written just after stall_seconds shows it, long before the next interval."""
    store = LocalFolderStore(str(tmp_path))
    writer = HeartbeatWriter(store, "a1", Progress(step=3), interval=30.0, stall_seconds=0.3)
    writer.start()
    time.sleep(0.8)
    hung = read_heartbeat(store)
    writer.stop()
    assert hung.seq == 1 and hung.silent_seconds > 0.3 and hung.step == 3


@pytest.mark.parametrize("health, interval", [
    ({}, 10.0),                                          # stall_seconds 120: at most 10 s
    ({"stall_seconds": 8}, 2.0),                         # a quarter of a short limit
    ({"stall_seconds": 60, "heartbeat_seconds": 30}, 30.0),
    ({"stall_seconds": 60, "heartbeat_seconds": 31}, "at most 30"),
    ({"heartbeat_seconds": 0}, "use a number > 0"),
])
def test_heartbeat_interval_is_well_under_stall_seconds(health, interval):
    from ringflow.training.formats.config import ConfigError, HealthConfig

    if isinstance(interval, str):
        with pytest.raises(ConfigError, match="health.heartbeat_seconds") as err:
            HealthConfig(**health)
        assert interval in str(err.value)
    else:
        assert HealthConfig(**health).heartbeat_interval() == interval
