"""Python's collector on the loop's schedule: off between collections, a cycle made in training lives until
the next scheduled step and no longer, what was held before the first step is frozen, and the collector is
given back as it was."""
import gc
import weakref

import pytest

from ringflow.training.rank.callbacks.garbage_collection import ScheduledGarbageCollection
from ringflow.training.formats.config import ConfigError, JobConfig
from ringflow.training.rank.loop import StepTiming


def timing(step: int) -> StepTiming:
    return StepTiming(step=step, epoch=0, step_time=0.01, sync_time=0.0, samples=32)


class Cycle:
    def __init__(self):
        self.me = self


def a_cycle() -> weakref.ref:
    """A weak reference to garbage only the cyclic collector can free."""
    return weakref.ref(Cycle())


@pytest.fixture
def collector():
    was_enabled = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    (gc.enable if was_enabled else gc.disable)()


def test_cycles_made_in_training_are_collected_on_the_scheduled_steps_only(collector):
    schedule = ScheduledGarbageCollection(every_steps=3)
    schedule.on_train_start(None)
    try:
        assert not gc.isenabled() and gc.get_freeze_count() > 0  # what the rank held before step 1: frozen
        garbage = a_cycle()
        for _ in range(2000):  # enough allocations that Python's own collector would have run
            [Cycle() for _ in range(10)]
        for step in (1, 2):
            schedule.on_step_end(None, timing(step))
            assert garbage() is not None, f"collected at step {step}, not a multiple of 3"
        schedule.on_step_end(None, timing(3))
        assert garbage() is None and schedule.collections == 1
    finally:
        schedule.restore()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_collector_is_given_back_as_it_was(collector):
    gc.disable()  # e.g. a process that manages its collector itself
    schedule = ScheduledGarbageCollection(every_steps=10)
    schedule.on_train_start(None)
    schedule.restore()
    assert not gc.isenabled() and gc.get_freeze_count() == 0
    schedule.restore()  # twice is harmless
    assert not gc.isenabled()


def test_restore_before_training_started_changes_nothing(collector):
    ScheduledGarbageCollection(every_steps=10).restore()
    assert gc.isenabled()


@pytest.mark.parametrize("value, ok", [(0, True), (1, True), (100, True), (-1, False), (2.5, False), ("100", False)])
def test_the_config_takes_a_whole_number_of_steps_or_zero(value, ok):
    doc = {"manifest_uri": "m/manifest.json", "run_uri": "run", "gc_every_steps": value}
    if ok:
        assert JobConfig.from_dict(doc).gc_every_steps == value
    else:
        with pytest.raises(ConfigError, match="gc_every_steps"):
            JobConfig.from_dict(doc)


def test_the_callback_refuses_zero_which_the_config_means_as_no_schedule():
    with pytest.raises(ValueError, match="Python's own collector"):
        ScheduledGarbageCollection(every_steps=0)
