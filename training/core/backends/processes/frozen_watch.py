"""The launcher's eye on an elastic job's frozen processes: one the kernel reports stopped (/proc state T: a
SIGSTOP, a terminal's SIGTSTP) stays a member of the job for ever, and every survivor waits on it. (A cgroup
freezer's processes show as sleeping, not stopped: not seen here.)

A stopped process runs nothing, its watchdog thread included, so it cannot end itself the way a hung rank does
(health/liveness.py). Horovod's driver counts it alive as long as it exists, so the survivors' rendezvous waits
for it, and torchrun restarts nobody while it lives. The survivors' collective already gave up on it after
`elastic.peer_timeout_seconds` (Gloo's wait on a silent peer); a process stopped that long is SIGKILLed here,
and named in one line: its death is then a death like any other, and the survivors go on without it (Horovod)
or every worker restarts at once (DDP). A traced process (state t: a debugger, py-spy) is left alone.
"""
from __future__ import annotations

import signal
import time
from typing import Callable

from . import proc
from .poller import Poller
from .proc import Process

POLL_SECONDS = 1.0
STOPPED = "T"


def overdue(stopped_since: dict[tuple[int, int], float], now: float, limit_seconds: float) -> list[tuple[int, int]]:
    """The processes (pid, start) stopped since a time at least `limit_seconds` before `now`."""
    return sorted(identity for identity, since in stopped_since.items() if now - since >= limit_seconds)


def still_stopped(stopped_since: dict[tuple[int, int], float], members: list[Process],
                  now: float) -> dict[tuple[int, int], float]:
    """`stopped_since` brought up to date with `members` as read now: a process seen stopped keeps the time it
    was first seen so; one that runs again (or has gone) is dropped."""
    return {p.identity: stopped_since.get(p.identity, now) for p in members if p.state == STOPPED}


class FrozenWatch:
    """Every POLL_SECONDS (`running()`): the job's processes (`members`) that the kernel reports stopped, and
    SIGKILL for each stopped `limit_seconds` or longer."""

    def __init__(self, members: Callable[[], list[Process]], limit_seconds: float, say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic):
        self._members, self._limit, self._say, self._clock = members, limit_seconds, say, clock
        self._since: dict[tuple[int, int], float] = {}

    def look(self) -> list[Process]:
        """Read the members once; kill those stopped too long. What it killed now."""
        members = self._members()
        now = self._clock()
        self._since = still_stopped(self._since, members, now)
        by_identity = {p.identity: p for p in members}
        killed = []
        for identity in overdue(self._since, now, self._limit):
            stopped_for = now - self._since.pop(identity)
            process = proc.current(by_identity[identity])  # read again: a SIGCONT since is not killed
            if process is None or process.state != STOPPED:
                continue
            process = proc.with_command(process)
            if proc.send(process, signal.SIGKILL):
                killed.append(process)
                self._say(f"{process.describe()} was stopped for {stopped_for:.0f} s, over "
                          f"elastic.peer_timeout_seconds ({self._limit:g} s): killed, so that the job goes on "
                          "without it (a rank; a launcher's death ends the job)")
        return killed

    def running(self) -> Poller:
        """While in this context, `look` every POLL_SECONDS on a thread of its own; a kill does not end the
        watch (another process may stop later)."""
        def look() -> bool:
            self.look()
            return False

        return Poller(look, POLL_SECONDS, "ringflow-frozen-watch")
