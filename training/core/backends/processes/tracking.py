"""Which process tracker runs here, and reopening a job's tracker from its record.

`auto` (the default) takes the first that works on this machine: a cgroup v2 (`cgroup.kill`), a cgroup v1
freezer, else a subreaper tree, which needs nothing but Linux. `RINGFLOW_PROCESS_TRACKING` (or the local
backend's `process_tracking`) forces one; a forced one that cannot work here is an error saying why.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from .cgroup import CgroupV1Freezer, CgroupV2
from .proc import Process
from .subreaper import ProcessTree
from .tracker import ProcessTracker, TrackingUnavailable

TRACKING_ENV = "RINGFLOW_PROCESS_TRACKING"
AUTO = "auto"
_KINDS: dict[str, Any] = {kind.mode: kind for kind in (CgroupV2, CgroupV1Freezer, ProcessTree)}
MODES = (AUTO, *_KINDS)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"process tracking {mode!r} is not one of {MODES}; use {AUTO!r} to take the best this "
                         "machine allows")
    return mode


def mode_from_env(environ: Mapping[str, str] | None = None) -> str:
    value = (os.environ if environ is None else environ).get(TRACKING_ENV) or AUTO
    try:
        return check_mode(value)
    except ValueError as exc:
        raise ValueError(f"${TRACKING_ENV}: {exc}") from None


def start_tracking(label: str, mode: str = AUTO) -> ProcessTracker:
    """A new, empty set of processes owned by this process; `label` goes into a cgroup's name."""
    check_mode(mode)
    if mode != AUTO:
        try:
            return _KINDS[mode].create(label)
        except TrackingUnavailable as exc:
            raise TrackingUnavailable(f"process tracking {mode!r} cannot work here: {exc}; set {TRACKING_ENV}="
                                      f"{AUTO} to use what this machine allows") from exc
    for kind in (CgroupV2, CgroupV1Freezer):
        try:
            return kind.create(label)
        except TrackingUnavailable:
            continue
    return ProcessTree.create(label)


def reopen(record: Mapping[str, Any]) -> ProcessTracker:
    """The tracker `record()` described, for a process other than its owner (it can stop, not spawn)."""
    mode = record.get("mode")
    if mode == ProcessTree.mode:
        owner = record["owner"]
        return ProcessTree(Process(pid=int(owner["pid"]), start=int(owner["start"]), ppid=0, state="?"),
                           record.get("mark"))
    if mode in _KINDS:
        return _KINDS[mode](str(record["path"]))
    raise ValueError(f"process tracking record {dict(record)!r} names no mode of {MODES[1:]}")
