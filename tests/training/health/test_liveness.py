"""The two liveness rules as tables: the in-job watchdog's (judged_in_job) and the watcher's outside the job
(judged_outside): a slow store that moves bytes is waited for, one that moves nothing is STORE_UNAVAILABLE,
and STALLED is the training thread's own silence, at start-up as in training."""
import dataclasses

import pytest

from ringflow.training.health.heartbeat import ENDED, Heartbeat
from ringflow.training.health.liveness import PEER_WAIT_STALLS, StoreSeen, judged_in_job, judged_outside
from ringflow.training.health.progress import FETCH, FIRST_STEP, RENDEZVOUS, RESTORE, TRAINING, ProgressReading
from ringflow.training.health.store_ops import StoreOpReading
from ringflow.training.health.verdict import STARTUP_SECONDS

STALL, STORE_TIMEOUT = 30.0, 300.0


def waiting(idle, seconds=500.0, what="upload of checkpoint ckpt-000000050"):
    return StoreOpReading(what, "s3://b/run", seconds, idle, 10 * 2**20)


def reading(step=40, silent=1.0, phase=TRAINING, wait=None, peers=False):
    return ProgressReading(step, phase if step is None else TRAINING, silent, 0.0, {}, wait, peers)


IN_JOB = [
    # name, reading, (status, evidence) or None
    ("steps completing", reading(silent=2.0), None),
    ("a slow step past the limit", reading(silent=31.0), ("STALLED", {"last_step": 40, "limit": STALL})),
    ("waiting for a slow store that moves bytes, for long", reading(silent=900.0, wait=waiting(idle=2.0)), None),
    ("waiting for a store that moved nothing for store_timeout", reading(silent=900.0, wait=waiting(idle=301.0)),
     ("STORE_UNAVAILABLE", {"store": "s3://b/run", "limit": STORE_TIMEOUT,
                            "operation": "upload of checkpoint ckpt-000000050"})),
    ("start-up fetch waiting for a slow download: as long as it takes",
     reading(step=None, phase=FETCH, silent=600.0, wait=waiting(idle=5.0, what="download of part-00000.parquet")),
     None),
    ("start-up work between two signs of progress: the start-up allowance",
     reading(step=None, phase=FETCH, silent=45.0), None),
    ("start-up fetch doing nothing past the allowance", reading(step=None, phase=FETCH, silent=61.0),
     ("STALLED", {"phase": FETCH, "last_step": None, "limit": STARTUP_SECONDS})),
    ("rendezvous past the allowance", reading(step=None, phase=RENDEZVOUS, silent=61.0),
     ("STALLED", {"phase": RENDEZVOUS, "limit": STARTUP_SECONDS})),
    ("first step computing past the allowance", reading(step=None, phase=FIRST_STEP, silent=61.0),
     ("STALLED", {"phase": FIRST_STEP})),
]


@pytest.mark.parametrize("name, got, expected", IN_JOB, ids=[c[0] for c in IN_JOB])
def test_in_job(name, got, expected):
    check(judged_in_job(got, STALL, STORE_TIMEOUT, rank=0), expected)


IN_A_COLLECTIVE = [
    # An elastic rank blocked in a collective waits PEER_WAIT_STALLS x stall_seconds: the peer that hangs judges
    # itself at stall_seconds and leaves, and its death fails the collective.
    ("waiting on a peer past stall_seconds", reading(silent=31.0, peers=True), None),
    ("waiting on a peer past twice stall_seconds", reading(silent=61.0, peers=True),
     ("STALLED", {"last_step": 40, "limit": PEER_WAIT_STALLS * STALL})),
    ("a store that moved nothing is the store's, collective or not",
     reading(silent=900.0, wait=waiting(idle=301.0), peers=True), ("STORE_UNAVAILABLE", {"limit": STORE_TIMEOUT})),
]


@pytest.mark.parametrize("name, got, expected", IN_A_COLLECTIVE, ids=[c[0] for c in IN_A_COLLECTIVE])
def test_in_job_waiting_on_peers(name, got, expected):
    check(judged_in_job(got, STALL, STORE_TIMEOUT, rank=1), expected)


def later_round(phase, silent, step=12, peers=False):
    """A rank of an elastic job after a change of workers (rank/elastic.py `_reset`): steps done, its phase back
    in start-up."""
    return ProgressReading(step, phase, silent, 0.0, {}, None, peers)


RECOVERY = STARTUP_SECONDS - 1  # a recovery's rendezvous: seconds past stall_seconds, within the start-up allowance
ELASTIC = [
    # An elastic job's round after a change of workers is start-up again: a recovery that waits for Horovod's
    # driver and a joining worker is no stall, a rendezvous that never ends (a frozen peer still counted) is one,
    # and silence once the round trains is judged as before.
    ("the survivors' rendezvous, waiting for a joining worker to start", later_round(RENDEZVOUS, RECOVERY), None),
    ("the round's restore from the commit", later_round(RESTORE, RECOVERY), None),
    ("the round's first step", later_round(FIRST_STEP, RECOVERY), None),
    ("a rendezvous that never ends (a frozen peer Horovod still counts as alive)",
     later_round(RENDEZVOUS, STARTUP_SECONDS + 1),
     ("STALLED", {"last_step": 12, "phase": RENDEZVOUS, "limit": STARTUP_SECONDS})),
    ("silent in training after the recovery", later_round(TRAINING, STALL + 1),
     ("STALLED", {"last_step": 12, "phase": None, "limit": STALL})),
    ("a step in a collective after the recovery: the peers' wait", later_round(TRAINING, STALL + 1, peers=True), None),
]


@pytest.mark.parametrize("name, got, expected", ELASTIC, ids=[c[0] for c in ELASTIC])
def test_in_job_after_a_change_of_workers(name, got, expected):
    check(judged_in_job(got, STALL, STORE_TIMEOUT, rank=0), expected)


@pytest.mark.parametrize("name, got, expected", ELASTIC, ids=[c[0] for c in ELASTIC])
def test_outside_after_a_change_of_workers(name, got, expected):
    """The same, from the heartbeat the new rank 0 writes: on time, and late (silent since its last word)."""
    on_time = Heartbeat("a1", 0, 1000.0, got.step, got.silent_seconds, 1000.0 - got.silent_seconds, "running",
                        got.phase, {}, None, 0.01, got.waiting_on_peers)
    check(judged_outside(on_time, 1001.0, INTERVAL, STALL, STORE_TIMEOUT, 900.0, StoreSeen(0.0, 1001.0), "s3://b/run"),
          expected)
    if not got.waiting_on_peers:
        late = dataclasses.replace(on_time, silent_seconds=0.0, progress_at=1000.0)  # rank 0 gone quiet since
        check(judged_outside(late, 1000.0 + got.silent_seconds, INTERVAL, STALL, STORE_TIMEOUT, 900.0,
                             StoreSeen(0.0, 1000.0 + got.silent_seconds), "s3://b/run"), expected)


def check(verdict, expected):
    if expected is None:
        assert verdict is None, verdict.reason
        return
    status, evidence = expected
    assert verdict.status == status, verdict.reason
    for key, value in evidence.items():
        assert verdict.evidence[key] == pytest.approx(value), key


INTERVAL = 5.0


def beat(written_at, silent, state="running", step=40, phase=TRAINING, wait=None, write_seconds=0.01, peers=False):
    return Heartbeat("a1", 3, written_at, step, silent, written_at - silent, state, phase, {}, wait, write_seconds,
                     peers)


FAST = 0.0  # a store column as a number: how slow the store is, its probe back just now (at `now`)
OUTSIDE = [
    # name, heartbeat, now, store (slow seconds, or a StoreSeen), (status, evidence) or None
    ("on time: the job's own reading", beat(1000.0, 2.0), 1004.0, FAST, None),
    ("on time, a slow step past the limit", beat(1000.0, 31.0), 1004.0, FAST, ("STALLED", {"seconds": 31.0})),
    ("on time, waiting for a slow store", beat(1000.0, 400.0, wait=waiting(idle=3.0)), 1004.0, FAST, None),
    ("on time, waiting for a store that moves nothing", beat(1000.0, 400.0, wait=waiting(idle=320.0)), 1004.0, FAST,
     ("STORE_UNAVAILABLE", {"seen_by": "the heartbeat of rank 0"})),
    ("late and the store answers at once: silence from its last word", beat(1000.0, 2.0), 1029.0, 0.05,
     ("STALLED", {"seconds": 31.0, "last_step": 40})),
    ("late, the store looks fast but the probe begun since it went late is not back: not yet silence",
     beat(1000.0, 2.0), 1029.0, StoreSeen(0.05, 1005.0), None),
    ("late, the probe begun as it went late is back", beat(1000.0, 2.0), 1029.0, StoreSeen(0.05, 1010.0),
     ("STALLED", {"seconds": 31.0})),
    ("late, no probe back yet at all", beat(1000.0, 2.0), 1029.0, StoreSeen(0.0, None), None),
    ("late, the store slow until just now: the held beat gets its interval again",
     beat(1000.0, 2.0), 1029.0, StoreSeen(0.05, 1028.0, ((1003.0, 1025.0),)), None),
    ("late, the store slow until just now, the probe that ended it not enough: one begun after it",
     beat(1000.0, 2.0), 1036.0, StoreSeen(0.05, 1003.0, ((1003.0, 1025.0),)), None),
    ("still nothing long after the store was last slow: silence, less the time it was slow",
     beat(1000.0, 2.0), 1060.0, StoreSeen(0.05, 1059.0, ((1003.0, 1025.0),)), ("STALLED", {"seconds": 40.0})),
    ("slow spells that overlap count once, those before the last word not at all",
     beat(1000.0, 2.0), 1060.0, StoreSeen(0.05, 1059.0, ((990.0, 999.0), (1003.0, 1020.0), (1010.0, 1025.0))),
     ("STALLED", {"seconds": 40.0})),
    ("a slow poll's reads take out only their own seconds, not the silence before them (a busy triggerer)",
     beat(1000.0, 2.0), 1040.0, StoreSeen(0.05, 1039.0, ((1034.0, 1036.0),)), ("STALLED", {"seconds": 40.0})),
    ("late, not yet past the limit", beat(1000.0, 2.0), 1020.0, 0.05, None),
    ("late because the store does not take writes (the watcher's probe hangs too)", beat(1000.0, 2.0), 1200.0,
     190.0, None),
    ("late because its own writes were slow", beat(1000.0, 2.0, write_seconds=40.0), 1200.0, FAST, None),
    ("late, its writes slow, but the beat itself reports silence past the limit (a disk busy with fsyncs)",
     beat(1000.0, 31.0, write_seconds=8.0), 1012.0, 8.0, ("STALLED", {"seconds": 31.0})),
    ("a store that takes no write for store_timeout", beat(1000.0, 2.0), 1301.0, 290.0,
     ("STORE_UNAVAILABLE", {"operation": "writes of heartbeat.json", "store": "s3://b/run"})),
    ("late after saying it waits for the store, and the store is fine: silence since then",
     beat(1000.0, 500.0, wait=waiting(idle=1.0)), 1031.0, FAST, ("STALLED", {"seconds": 31.0})),
    ("late, its last word a wait that moved nothing for store_timeout", beat(1000.0, 400.0, wait=waiting(idle=320.0)),
     1100.0, 90.0, ("STORE_UNAVAILABLE", {"seen_by": "the heartbeat of rank 0"})),
    ("starting (no step yet): the rendezvous allowance", beat(1000.0, 40.0, step=None, phase=RENDEZVOUS), 1001.0,
     FAST, None),
    ("starting, fetching with nothing moving", beat(1000.0, 61.0, step=None, phase=FETCH), 1001.0, FAST,
     ("STALLED", {"phase": FETCH})),
    ("an elastic rank 0 blocked in a collective, past stall_seconds: its peer that hangs leaves first",
     beat(1000.0, 31.0, peers=True), 1004.0, FAST, None),
    ("an elastic rank 0 blocked in a collective past twice stall_seconds", beat(1000.0, 61.0, peers=True), 1004.0,
     FAST, ("STALLED", {"limit": PEER_WAIT_STALLS * STALL})),
    ("ended: nothing to count", beat(1000.0, 2.0, state=ENDED), 9999.0, FAST, None),
    ("no heartbeat yet: since the watcher saw it run, allowing for start-up", None, 1030.0, FAST, None),
    ("no heartbeat past the start-up allowance", None, 1061.0, FAST, ("STALLED", {"limit": STARTUP_SECONDS})),
    ("no heartbeat past the allowance, the probe not back", None, 1061.0, StoreSeen(0.0, 1005.0), None),
    ("no heartbeat, and the store does not take writes", None, 1061.0, 50.0, None),
]


@pytest.mark.parametrize("name, heartbeat, now, store, expected", OUTSIDE, ids=[c[0] for c in OUTSIDE])
def test_outside(name, heartbeat, now, store, expected):
    if not isinstance(store, StoreSeen):
        store = StoreSeen(store, now)
    check(judged_outside(heartbeat, now, INTERVAL, STALL, STORE_TIMEOUT, 1000.0, store, "s3://b/run"), expected)


def test_a_live_job_is_never_silent_between_health_records():
    """Health records every 10 steps of 20 s each, stall_seconds 60: each heartbeat says < 20 s, whatever
    the gap between records; the old watcher called this STALLED after 60 s without a record."""
    for t in range(0, 300, 5):
        assert judged_outside(beat(1000.0 + t, t % 20), 1000.0 + t + 2, INTERVAL, 60, STORE_TIMEOUT, 1000.0,
                              StoreSeen(0.0, 1000.0 + t), "s3://b/run") is None


@pytest.mark.parametrize("records_step, expected", [
    (None, None),  # no step recorded: still start-up, STARTUP_SECONDS
    (35, ("STALLED", {"last_step": 35, "limit": STALL})),  # the records show training: stall_seconds
])
def test_a_late_beat_from_start_up_is_judged_by_what_the_records_show(records_step, expected):
    """Rank 0 beat while it fetched, trained 35 steps and froze before its next beat: its records say it is
    past start-up, so the silence is judged against stall_seconds, not the start-up allowance."""
    last = beat(1000.0, 1.0, step=None, phase=FETCH)
    check(judged_outside(last, 1000.0 + STALL + 5, INTERVAL, STALL, STORE_TIMEOUT, 1000.0,
                         StoreSeen(0.0, 1000.0 + STALL), "s3://b/run",
                         records_step=records_step), expected)
