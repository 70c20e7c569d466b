"""The fallback where no cgroup can be made (not root, a read-only /sys/fs/cgroup in a container, cgroup v2
without delegation): the job's processes are the owner's descendants, walked in /proc.

A process whose parent dies is normally handed to init, leaving the tree. The owner marks itself a child
subreaper (prctl PR_SET_CHILD_SUBREAPER), so such orphans (a double fork, the ranks of a dead `mpirun`) are
handed to it instead and stay its descendants. What this cannot see: a process whose owner has died (its
orphans then go to the next subreaper up, or init); the local backend's supervisor therefore survives
SIGTERM and is killed only after the processes below it.

The owner may have children of its own that are not the job's (a test runner's servers, another job of the
same process): only descendants that carry this tree's mark are members. The mark is an environment variable
every process the tree spawns starts with (TREE_ENV: the marks of every tree it belongs to, nested trees
appending theirs), which children inherit through forks and execs, and orphans keep when they are handed to
the owner. A process that clears its whole environment leaves the tree's view.

The kill first stops every descendant with SIGSTOP, sweeping the tree again until a sweep finds nobody new:
a stopped process cannot fork, so the set stops growing; then SIGKILL (and SIGCONT) to each.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import uuid
from typing import Any, Sequence

from . import proc
from .proc import Process
from .tracker import ProcessTracker, TrackingUnavailable

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
# The marks of the process trees a process belongs to, separated by spaces (see the module's docstring).
TREE_ENV = "RINGFLOW_PROCESS_TREES"
# A sweep that finds nobody new ends the SIGSTOP phase; a tree forking faster than we can sweep is cut off
# here, and the stop's check repeats the kill for whatever it missed.
MAX_SWEEPS = 50


def _prctl(option: int, value: Any) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    # prctl is variadic and reads unsigned longs: a plain int could arrive with garbage in its upper half.
    if isinstance(value, int):
        value = ctypes.c_ulong(value)
    zero = ctypes.c_ulong(0)
    if libc.prctl(ctypes.c_int(option), value, zero, zero, zero) != 0:
        errno = ctypes.get_errno()
        raise TrackingUnavailable(f"prctl({option}) failed: {os.strerror(errno)}")


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag))
    return bool(flag.value)


class ProcessTree(ProcessTracker):
    mode = "subreaper"

    def __init__(self, owner: Process, mark: str | None, restore_subreaper: bool | None = None):
        """mark: what this tree's processes carry in TREE_ENV; None (a record from before marks): every
        descendant of the owner."""
        self.owner, self.mark = owner, mark
        self._restore = restore_subreaper  # the owner's own flag before create() set it; None: not ours

    @classmethod
    def create(cls, label: str) -> "ProcessTree":
        was = is_subreaper()
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        owner = proc.read(os.getpid())
        assert owner is not None
        return cls(owner, f"{label}-{uuid.uuid4().hex[:12]}", restore_subreaper=was)

    def record(self) -> dict[str, Any]:
        return {"mode": self.mode, "owner": {"pid": self.owner.pid, "start": self.owner.start}, "mark": self.mark}

    def spawn(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
        env = dict(popen_kwargs.pop("env", None) or os.environ)
        env[TREE_ENV] = " ".join(filter(None, [env.get(TREE_ENV, ""), self.mark]))
        return subprocess.Popen(argv, env=env, **popen_kwargs)

    def members(self) -> list[Process]:
        if proc.current(self.owner) is None:
            return []  # the owner is gone: its tree is no longer ours to walk (see the module's docstring)
        found = [p for p in proc.descendants(self.owner.pid, proc.snapshot()) if not p.ended]
        if self.mark is None:
            return found
        return [p for p in found if self.mark in (proc.environment_value(p.pid, TREE_ENV) or "").split()]

    def kill_all(self) -> None:
        stopped: dict[tuple[int, int], Process] = {}
        for _ in range(MAX_SWEEPS):
            new = [p for p in self.members() if p.identity not in stopped]
            if not new:
                break
            for p in new:
                proc.send(p, signal.SIGSTOP)
                stopped[p.identity] = p
        for p in stopped.values():
            proc.send(p, signal.SIGKILL)
            proc.send(p, signal.SIGCONT)

    def close(self) -> None:
        if self._restore is not None and not self._restore:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
            self._restore = None


def reap_adopted(keep: int) -> None:
    """Collect the ended orphans handed to this process as a subreaper, which would otherwise stay zombies
    until it exits; never `keep` (the child whose Popen waits for it). Only for a process whose every other
    child is such an orphan (the supervisor): it would take another caller's children's exit statuses."""
    me = os.getpid()
    for p in proc.snapshot():
        if p.ppid == me and p.ended and p.pid != keep:
            try:
                os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:
                pass
