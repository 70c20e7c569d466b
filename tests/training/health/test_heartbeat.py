"""heartbeat.json: what the watcher outside the job reads silence from, and rank 0's writer thread."""
import time

import pytest

from ringflow.training.health.heartbeat import (
    ATTEMPT_LINE, ENDED, Heartbeat, HeartbeatWriter, attempt_in_log, read_heartbeat, silence_seen_outside,
)
from ringflow.training.health.progress import Progress
from ringflow.training.health.verdict import STARTUP_SECONDS
from ringflow.training.store import LocalFolderStore

INTERVAL = 5.0


def beat(written_at, silent, state="running", step=40):
    return Heartbeat("a1", 3, written_at, step, silent, written_at - silent, state)


SILENCE = [
    # name, heartbeat, now, (seconds, last step, limit) or None
    ("on time: the job's own measure", beat(1000.0, 2.0), 1004.0, (2.0, 40, 30.0)),
    ("on time, slow step in progress", beat(1000.0, 90.0), 1009.0, (90.0, 40, 30.0)),
    ("late: silence grows from its last word", beat(1000.0, 2.0), 1000.0 + 2 * INTERVAL + 1, (13.0, 40, 30.0)),
    ("starting (no step yet): the start-up allowance", beat(1000.0, 40.0, step=None), 1001.0,
     (40.0, None, STARTUP_SECONDS)),
    ("ended: nothing to count", beat(1000.0, 2.0, state=ENDED), 9999.0, None),
    ("no heartbeat yet: since the watcher saw it run, allowing for start-up", None, 1030.0,
     (30.0, None, STARTUP_SECONDS)),
]


@pytest.mark.parametrize("name, heartbeat, now, expected", SILENCE, ids=[c[0] for c in SILENCE])
def test_silence_seen_outside(name, heartbeat, now, expected):
    got = silence_seen_outside(heartbeat, now, INTERVAL, 30.0, watching_since=1000.0)
    assert ((got.seconds, got.last_step, got.limit) if got else None) == expected


def test_a_live_job_is_never_silent_between_health_records():
    """Health records every 10 steps of 20 s each, stall_seconds 60: each heartbeat says < 20 s, whatever
    the gap between records; the old watcher called this STALLED after 60 s without a record."""
    for t in range(0, 300, 5):
        silent = t % 20
        assert silence_seen_outside(beat(1000.0 + t, silent), 1000.0 + t + 2, INTERVAL, 60, 1000.0).seconds < 60


def test_round_trip_and_garbage(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    assert read_heartbeat(store) is None
    store.put_bytes("heartbeat.json", beat(1.0, 0.5).to_json())
    assert read_heartbeat(store) == beat(1.0, 0.5)
    for raw in (b"{", b"[]", b'{"attempt": "a1"}'):
        assert Heartbeat.from_json(raw) is None


def test_attempt_line_is_found_in_launcher_output():
    line = ATTEMPT_LINE.format(attempt="9f3c0d")
    assert attempt_in_log(line) == "9f3c0d"
    assert attempt_in_log(f"[1,0]<stdout>:{line}") == "9f3c0d"
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
    from ringflow.training.config import ConfigError, HealthConfig

    if isinstance(interval, str):
        with pytest.raises(ConfigError, match="health.heartbeat_seconds") as err:
            HealthConfig(**health)
        assert interval in str(err.value)
    else:
        assert HealthConfig(**health).heartbeat_interval() == interval
