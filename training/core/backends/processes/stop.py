"""Stopping a job's processes: SIGTERM, a grace period, SIGKILL to whatever is left in whatever state, then a
bounded check that none is left. Used for a stop on request and, after a job's launcher has ended, for
whatever it left behind.

Stopped processes are not sent SIGCONT before their grace period: a rank frozen by a host or a container
runtime that resumed now would carry on writing (its watchdog's STALLED result over a retry's, say). They get
SIGTERM, which waits, and then SIGKILL, which a stopped process obeys at once. A process in uninterruptible
sleep dies when its system call returns; the check waits `kill_wait_seconds` for that and then names it.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Callable, Mapping, Sequence

from . import proc
from .proc import Process
from .tracker import ProcessTracker

# Between SIGTERM and SIGKILL, unless the caller says otherwise: the local backend's stop_grace_seconds,
# which its supervisor hands to the job's own launcher (`ringflow train`) in this variable.
DEFAULT_GRACE_SECONDS = 10.0
GRACE_ENV = "RINGFLOW_STOP_GRACE_SECONDS"
# After SIGKILL, how long the check waits for every process to be gone before it says which are not.
KILL_WAIT_SECONDS = 10.0
POLL_SECONDS = 0.1


def grace_from_env(environ: Mapping[str, str] | None = None) -> float:
    value = (os.environ if environ is None else environ).get(GRACE_ENV)
    if not value:
        return DEFAULT_GRACE_SECONDS
    try:
        grace = float(value)
    except ValueError:
        grace = -1.0
    if not grace >= 0:
        raise ValueError(f"${GRACE_ENV} is {value!r}; set it to the seconds between SIGTERM and SIGKILL (>= 0)")
    return grace


@dataclasses.dataclass(frozen=True)
class StopOutcome:
    """Who a stop found, and how each ended: within the grace period, after SIGKILL, or not at all."""

    terminated: tuple[Process, ...] = ()
    killed: tuple[Process, ...] = ()
    remaining: tuple[Process, ...] = ()   # as last seen: their state says why (D, for one)

    @property
    def found(self) -> tuple[Process, ...]:
        return self.terminated + self.killed + self.remaining

    @property
    def clean(self) -> bool:
        return not self.remaining

    def describe(self) -> str:
        parts = []
        for label, group in (("ended on SIGTERM", self.terminated), ("killed", self.killed),
                             ("STILL ALIVE", self.remaining)):
            if group:
                parts.append(f"{label}: " + "; ".join(p.describe() for p in group))
        return " | ".join(parts) or "no process was left"


class ProcessesRemain(RuntimeError):
    """Processes of a job outlived the stop's SIGKILL and its wait."""

    def __init__(self, what: str, outcome: StopOutcome, waited: float):
        self.outcome = outcome
        names = "; ".join(p.describe() for p in outcome.remaining)
        super().__init__(
            f"{what}: {len(outcome.remaining)} process(es) still alive {waited:g} s after SIGKILL: {names}. A "
            "process in uninterruptible sleep (D) ends when its system call returns (a hung disk or network "
            "file system holds it); the job reads as running until it has")


def stop_processes(tracker: ProcessTracker, grace_seconds: float, *, last: Sequence[Process] = (),
                   kill_wait_seconds: float = KILL_WAIT_SECONDS) -> StopOutcome:
    """Stop every member of `tracker`, and the processes in `last` (outside the set, such as the supervisor
    the job runs under: waited for, then killed after the members). Returns once all are gone, or
    `kill_wait_seconds` after SIGKILL with the ones that are not."""
    # Everyone found once, by identity, with its command line: a member stays ours even if it leaves the
    # tracker's view (an orphan whose owner died), and a report can name a process that has ended.
    seen: dict[tuple[int, int], Process] = {p.identity: proc.with_command(p) for p in last}
    last_ids = set(seen)

    def alive() -> list[Process]:
        for p in tracker.members():
            if p.identity not in seen:
                seen[p.identity] = proc.with_command(p)
        return [dataclasses.replace(seen[now.identity], state=now.state)
                for now in map(proc.current, list(seen.values())) if now is not None]

    termed: set[tuple[int, int]] = set()
    live = alive()
    deadline = time.monotonic() + grace_seconds
    while live:
        for p in live:
            if p.identity not in termed and p.identity not in last_ids:
                proc.send(p, signal.SIGTERM)
                termed.add(p.identity)
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
        live = alive()
    killed = {p.identity for p in live}
    deadline = time.monotonic() + kill_wait_seconds
    while live:
        # Again each round: a process that forked while the last kill was on its way is caught by the next.
        tracker.kill_all()
        for p in live:
            proc.send(p, signal.SIGKILL)
            proc.send(p, signal.SIGCONT)
        time.sleep(POLL_SECONDS)
        live = alive()
        if time.monotonic() >= deadline:
            break
    remaining = {p.identity for p in live}
    ended = [p for key, p in seen.items() if key not in remaining and (key in termed or key in killed)]
    return StopOutcome(terminated=tuple(p for p in ended if p.identity not in killed),
                       killed=tuple(p for p in ended if p.identity in killed),
                       remaining=tuple(live))


def stop_leftovers(tracker: ProcessTracker, grace_seconds: float, say: Callable[[str], None]) -> StopOutcome:
    """After the job's launcher has ended: stop whatever of the set still runs (it was left behind), and
    `say` which processes those were and how each ended, or which would not."""
    outcome = stop_processes(tracker, grace_seconds)
    if outcome.found:
        say(f"{len(outcome.found)} process(es) outlived the job's launcher and were stopped: {outcome.describe()}")
    if not outcome.clean:
        say(f"error: {ProcessesRemain('after the job ended', outcome, KILL_WAIT_SECONDS)}")
    return outcome
