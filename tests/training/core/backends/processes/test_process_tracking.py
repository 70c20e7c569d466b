"""Choosing a way to track processes, and reopening one from its record."""
import pytest

from ringflow.training.core.backends.processes import cgroup, tracking
from ringflow.training.core.backends.processes.subreaper import ProcessTree, is_subreaper
from ringflow.training.core.backends.processes.tracker import TrackingUnavailable


@pytest.mark.parametrize("environ, expected", [
    ({}, "auto"), ({"RINGFLOW_PROCESS_TRACKING": ""}, "auto"),
    ({"RINGFLOW_PROCESS_TRACKING": "subreaper"}, "subreaper"),
    ({"RINGFLOW_PROCESS_TRACKING": "cgroup-v1"}, "cgroup-v1"),
])
def test_mode_from_env(environ, expected):
    assert tracking.mode_from_env(environ) == expected


def test_an_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match=r"\$RINGFLOW_PROCESS_TRACKING: process tracking 'cgroups' is not one of"
                                         r".*'subreaper'.*use 'auto'"):
        tracking.mode_from_env({"RINGFLOW_PROCESS_TRACKING": "cgroups"})


def unavailable(cls):
    raise TrackingUnavailable("no cgroup2 hierarchy is mounted")


def test_a_forced_mode_that_cannot_work_says_why_and_what_to_do(monkeypatch):
    monkeypatch.setattr(cgroup.CgroupV2, "home", classmethod(unavailable))
    with pytest.raises(TrackingUnavailable, match="process tracking 'cgroup-v2' cannot work here: no cgroup2 "
                                                  "hierarchy is mounted; set RINGFLOW_PROCESS_TRACKING=auto"):
        tracking.start_tracking("job", "cgroup-v2")


def test_auto_falls_back_to_a_subreaper_tree_where_no_cgroup_can_be_made(monkeypatch):
    for kind in (cgroup.CgroupV2, cgroup.CgroupV1Freezer):
        monkeypatch.setattr(kind, "home", classmethod(unavailable))
    was = is_subreaper()
    with tracking.start_tracking("job") as tracker:
        assert isinstance(tracker, ProcessTree) and is_subreaper()
        record = tracker.record()
    assert is_subreaper() == was  # the owner's own flag is put back
    assert tracking.reopen(record).record() == record


@pytest.mark.parametrize("record", [
    {"mode": "cgroup-v2", "path": "/sys/fs/cgroup/unified/ringflow-x-1"},
    {"mode": "cgroup-v1", "path": "/sys/fs/cgroup/freezer/ringflow-x-1"},
    {"mode": "subreaper", "owner": {"pid": 12, "start": 34}, "mark": "x-0123456789ab"},
    {"mode": "subreaper", "owner": {"pid": 12, "start": 34}, "mark": None},  # written before marks
])
def test_reopen_round_trips(record):
    assert tracking.reopen(record).record() == record


def test_reopen_refuses_an_unknown_record():
    with pytest.raises(ValueError, match="names no mode of"):
        tracking.reopen({"mode": "systemd-scope"})
