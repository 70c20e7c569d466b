"""What a process tracker is: the set of every process one job made, whatever they did to leave their parent.

A job's processes cannot be found by their process group or their parent: `horovodrun` starts `mpirun` in a
session of its own, Open MPI puts each rank in a process group of its own, plain torchrun starts each rank in
a session of its own (ringflow's forks them: rank/forked_torchrun.py), and a double fork or a dead `mpirun`
leaves processes with a parent outside the job.
A tracker knows them anyway (a cgroup they inherit, or a subreaper they stay under), so a stop can reach
every one directly instead of trusting a launcher in between to pass a signal on.

The process that starts the job (its owner) stays outside the set, so it can stop the set, check that
nothing is left and record what happened; anyone else (the backend's delete from another process) reopens
the same set from `record()`.
"""
from __future__ import annotations

import abc
import subprocess
from typing import Any, ClassVar, Sequence

from .proc import Process

# How long whoever stopped a set waits for the kernel to let go of its ended processes before leaving the
# cgroup behind (status() removes it later): a zombie is reaped by its parent or, orphaned, by init.
RELEASE_WAIT_SECONDS = 2.0


class TrackingUnavailable(RuntimeError):
    """This way of tracking processes cannot work here (no cgroup hierarchy we may write to, ...)."""


class ProcessTracker(abc.ABC):
    mode: ClassVar[str]

    @abc.abstractmethod
    def members(self) -> list[Process]:
        """The set's processes that have not ended, now."""

    @abc.abstractmethod
    def kill_all(self) -> None:
        """SIGKILL every member, whatever its state (stopped, frozen, ignoring SIGTERM), leaving no window in
        which a member could fork a child the kill misses. Does not wait for them to go."""

    @abc.abstractmethod
    def spawn(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside the set (its children and theirs join it too); the caller stays outside."""

    @abc.abstractmethod
    def record(self) -> dict[str, Any]:
        """Plain JSON that `tracking.reopen` turns back into a tracker of the same set, in another process."""

    def release(self, wait_seconds: float = 0.0) -> bool:
        """Remove what tracking made (a cgroup), once no member is left, waiting up to `wait_seconds` for
        the kernel to let go of ended ones (a zombie stays in its cgroup until reaped). True when nothing is
        left over."""
        return True

    def close(self) -> None:
        """The owner is done with the set: undo what tracking changed about the owner itself."""

    def __enter__(self) -> "ProcessTracker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
