"""A cgroup per job: the kernel puts every child of a member into the member's cgroup, so no new session,
process group, double fork or dead parent takes a process out of it.

Two kinds, tried in this order (tracking.py):
- cgroup v2 (`cgroup-v2`): a cgroup2 hierarchy, at /sys/fs/cgroup on a unified host or
  /sys/fs/cgroup/unified on a hybrid one. `cgroup.kill` (Linux 5.14+) SIGKILLs every process of the cgroup
  and of the cgroups below it in one step, stopped or not, so nothing can fork its way out of the kill.
- cgroup v1 freezer (`cgroup-v1`): where only v1 is writable. The kill freezes the cgroup first (no member
  runs, so none forks), sends SIGKILL to each member, then thaws it: a frozen task acts on SIGKILL only once
  THAWED.

The job's cgroup is made below the cgroup the owner runs in (`ringflow-<label>-<random>`), so a nested
owner (`ringflow train` under the local backend's supervisor) nests its own cgroup inside the job's, and
the job's kill reaches it. The owner enters the cgroup only to start the job's first process, then goes
back (`spawn`), so it is never a member of the set it stops.
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
import uuid
from typing import Any, ClassVar, Sequence

from . import proc
from .proc import Process
from .tracker import ProcessTracker, TrackingUnavailable

MOUNTINFO = "/proc/self/mountinfo"
OWN_CGROUPS = "/proc/self/cgroup"
# How long a v1 kill waits for the freezer to report FROZEN. A task in uninterruptible sleep can hold the
# cgroup at FREEZING; the kill goes ahead after this anyway, and the stop's check repeats it.
FREEZE_WAIT_SECONDS = 1.0


def mount_point(mountinfo: str, version: int, controller: str = "") -> tuple[str, str] | None:
    """(where the hierarchy is mounted, which of its cgroups the mount shows as its root), from the text
    of /proc/self/mountinfo: the cgroup2 mount for version 2, the v1 mount carrying `controller` for 1."""
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        if (version == 2 and fstype == "cgroup2") or (version == 1 and fstype == "cgroup" and controller in options):
            return _unescape(fields[4]), _unescape(fields[3])
    return None


def own_cgroup(proc_cgroup: str, version: int, controller: str = "") -> str | None:
    """The cgroup this process is in, from the text of /proc/self/cgroup: `0::<path>` for v2,
    `<id>:<controllers>:<path>` with `controller` among the controllers for v1."""
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 2 and hierarchy == "0" and controllers == "":
            return path
        if version == 1 and controller in controllers.split(","):
            return path
    return None


def cgroup_dir(mount: str, mount_root: str, path: str) -> str | None:
    """The folder of cgroup `path` under a mount showing `mount_root` as its root; None when the mount does
    not show it (a cgroup namespace or bind mount that hides where this process is)."""
    relative = os.path.relpath(path, mount_root)
    if relative.startswith(".."):
        return None
    return os.path.normpath(os.path.join(mount, relative))


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _removed(exc: OSError) -> bool:
    """Whether `exc` says the cgroup file is gone: removed (FileNotFoundError), or being removed (cgroup v2
    answers ENODEV for a released cgroup's files), so the cgroup holds nothing."""
    return isinstance(exc, FileNotFoundError) or exc.errno == errno.ENODEV


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


class Cgroup(ProcessTracker):
    version: ClassVar[int]
    controller: ClassVar[str] = ""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def home(cls) -> str:
        """The folder of the cgroup this process is in now, in this kind's hierarchy."""
        where = mount_point(_read(MOUNTINFO), cls.version, cls.controller)
        if where is None:
            raise TrackingUnavailable(f"no {cls.mode} hierarchy is mounted")
        path = own_cgroup(_read(OWN_CGROUPS), cls.version, cls.controller)
        folder = cgroup_dir(where[0], where[1], path) if path is not None else None
        if folder is None or not os.path.isdir(folder):
            raise TrackingUnavailable(f"this process's {cls.mode} cgroup is not visible under {where[0]}")
        return folder

    @classmethod
    def create(cls, label: str) -> "Cgroup":
        parent = cls.home()
        path = os.path.join(parent, f"ringflow-{label}-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(path)
        except OSError as exc:
            raise TrackingUnavailable(f"cannot make a cgroup in {parent}: {exc.strerror}") from exc
        tracker = cls(path)
        try:
            tracker.check_usable()
            # Entering and leaving once proves spawn() will work (v2 also needs write access to the
            # common ancestor's cgroup.procs, which a delegated or read-only tree may not give).
            tracker._enter(path)
            tracker._enter(parent)
        except (OSError, TrackingUnavailable) as exc:
            os.rmdir(path)
            reason = exc if isinstance(exc, TrackingUnavailable) else exc.strerror
            raise TrackingUnavailable(f"cannot move processes into {path}: {reason}") from exc
        return tracker

    def check_usable(self) -> None:
        """Raise TrackingUnavailable when this cgroup lacks what kill_all needs."""

    def record(self) -> dict[str, Any]:
        return {"mode": self.mode, "path": self.path}

    def _enter(self, folder: str) -> None:
        _write(os.path.join(folder, "cgroup.procs"), str(os.getpid()))

    def spawn(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
        parent = os.path.dirname(self.path)
        self._enter(self.path)
        try:
            return subprocess.Popen(argv, **popen_kwargs)
        finally:
            self._enter(parent)

    def folders(self) -> list[str]:
        """This cgroup and the ones below it, deepest first (the order rmdir needs)."""
        found = []
        for root, _dirs, _files in os.walk(self.path, topdown=False):
            found.append(root)
        return found

    def members(self) -> list[Process]:
        pids: set[int] = set()
        for folder in self.folders():
            try:
                pids.update(int(line) for line in _read(os.path.join(folder, "cgroup.procs")).split())
            except OSError as exc:
                if not _removed(exc):
                    raise
        found = (proc.read(pid) for pid in sorted(pids))
        return [p for p in found if p is not None and not p.ended]

    def release(self, wait_seconds: float = 0.0) -> bool:
        deadline = time.monotonic() + wait_seconds
        while True:
            left = False
            for folder in self.folders():
                try:
                    os.rmdir(folder)
                except FileNotFoundError:
                    pass
                except OSError:  # EBUSY: a member, or a zombie its parent (or init) has not reaped yet
                    left = True
            if not left or time.monotonic() >= deadline:
                return not left
            time.sleep(0.05)


class CgroupV2(Cgroup):
    mode = "cgroup-v2"
    version = 2

    def check_usable(self) -> None:
        if not os.path.exists(os.path.join(self.path, "cgroup.kill")):
            raise TrackingUnavailable("the kernel has no cgroup.kill (Linux 5.14 or later has)")

    def kill_all(self) -> None:
        try:
            _write(os.path.join(self.path, "cgroup.kill"), "1")
        except OSError as exc:
            if not _removed(exc):
                raise


class CgroupV1Freezer(Cgroup):
    mode = "cgroup-v1"
    version = 1
    controller = "freezer"

    def kill_all(self) -> None:
        state = os.path.join(self.path, "freezer.state")
        try:
            _write(state, "FROZEN")
        except FileNotFoundError:
            return
        deadline = time.monotonic() + FREEZE_WAIT_SECONDS
        while _read(state).strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            for member in self.members():
                proc.send(member, signal.SIGKILL)
        finally:
            # A frozen task acts on its SIGKILL only once thawed. Every cgroup below is thawed too: a nested
            # owner (`ringflow train` under the supervisor) killed while it stopped its own cgroup leaves that
            # one FROZEN by its own state, which thawing this one does not undo, and its members in D.
            for folder in reversed(self.folders()):
                try:
                    _write(os.path.join(folder, "freezer.state"), "THAWED")
                except OSError as exc:
                    if not _removed(exc):
                        raise
