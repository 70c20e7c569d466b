"""The watcher's probe of the run folder's store: how slow the store is now, when a probe write last came
back, and the spells it was seen slow in (liveness.judged_outside decides with it)."""
import threading
import time

import pytest

from ringflow.training.core.runs.store_probe import StoreProbe


class HeldStore:
    """The one call the probe makes of a store, answered in memory once `release` is set (a store that
    stalls writes; set at once, a store that answers at once, whatever the disk's load)."""
    def __init__(self, released=False):
        self.release = threading.Event()
        if released:
            self.release.set()

    def put_bytes(self, key, data):
        self.release.wait(30)


def wait_for_answer(probe, after):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = probe.seen()
        if seen.answered_at is not None and seen.answered_at >= after:
            return seen
        time.sleep(0.01)
    raise AssertionError("the probe write never came back")


def test_a_fast_store_answers_and_is_never_seen_slow(tmp_path):
    probe = StoreProbe(HeldStore(released=True), slow_after=1.0)
    assert probe.seen().answered_at is None  # nothing known until a probe write is back
    began = time.time()
    probe.probe()
    seen = wait_for_answer(probe, began)
    assert seen.slow_seconds < 1.0 and seen.slow_spells == ()


def test_a_held_write_is_slow_while_in_flight_and_remembered_once_back(tmp_path):
    store = HeldStore()
    # Slow after 1 s: the fast write below starts a thread and must be back within it, which a host under a full
    # suite's load (11 busy processes on 2 cores) once took 0.26 s to do.
    probe = StoreProbe(store, slow_after=1.0)
    began = time.time()
    probe.probe()
    time.sleep(1.2)
    probe.probe()  # one write at a time: this one is not started
    held = probe.seen()
    assert held.slow_seconds >= 1.2 and held.answered_at is None
    store.release.set()
    back = wait_for_answer(probe, began)
    (spell,) = back.slow_spells  # from the write's start to its end
    assert spell[0] == back.answered_at and spell[1] - spell[0] >= 1.2
    # A fast write after it: the store answers now, and the spell it was slow in is kept.
    again = time.time()
    probe.probe()
    after = wait_for_answer(probe, again)
    assert after.slow_seconds < 1.0 and after.slow_spells == back.slow_spells


def test_a_one_off_look_waits_for_its_probe_a_held_one_no_longer_than_asked(tmp_path):
    fast = StoreProbe(HeldStore(released=True), slow_after=1.0)
    began = time.time()
    fast.probe(wait=5.0)
    assert fast.seen().answered_at >= began  # back before probe() returned
    store = HeldStore()
    held = StoreProbe(store, slow_after=0.2)
    waited = time.monotonic()
    held.probe(wait=0.3)
    assert 0.3 <= time.monotonic() - waited < 5
    assert held.seen().answered_at is None and held.seen().slow_seconds >= 0.3  # in flight: slow
    store.release.set()


def test_slow_reads_count_as_a_slow_store(tmp_path):
    probe = StoreProbe(HeldStore(released=True), slow_after=1.0)
    probe.read_took(0.1)
    assert probe.seen().slow_spells == ()
    probe.read_took(3.0)
    seen = probe.seen()
    (spell,) = seen.slow_spells
    assert seen.slow_seconds == 3.0 and spell[1] - spell[0] == pytest.approx(3.0)
