"""Processes as /proc shows them, and signals that reach exactly the process meant.

A pid alone does not name a process: once a process is reaped its pid can be given to a new one, and a stop
that signalled a stale pid could kill a stranger. A `Process` is a pid plus its start time (clock ticks since
boot, /proc/<pid>/stat field 22), and `send` signals through a pidfd opened before the start time is checked
again, so the signal reaches the process that was checked or nobody.
"""
from __future__ import annotations

import dataclasses
import os
import signal
from typing import Iterable

PROC = "/proc"
# What each /proc state letter means, for the reports that name a process that would not go.
STATE_WORDS = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep", "T": "stopped", "t": "traced",
               "Z": "zombie", "X": "dead", "I": "idle", "P": "parked", "W": "waking", "K": "wakekill"}
GONE_STATES = ("Z", "X")  # a zombie has ended: only its exit status waits for its parent


@dataclasses.dataclass(frozen=True)
class Process:
    pid: int
    start: int      # start time, clock ticks since boot: with the pid, who this process is
    ppid: int
    state: str      # the /proc state letter, when it was read
    name: str = ""  # the kernel's short name (comm)
    command: str = ""  # its command line, once `with_command` read it (a report may outlive the process)

    @property
    def identity(self) -> tuple[int, int]:
        return self.pid, self.start

    @property
    def ended(self) -> bool:
        return self.state in GONE_STATES

    def describe(self) -> str:
        """`pid 123 (T stopped) python -m ringflow.training job.json`: for logs and errors."""
        command = self.command or command_line(self.pid) or self.name
        return f"pid {self.pid} ({self.state} {STATE_WORDS.get(self.state, 'unknown state')}) {command}"[:300]

    def to_dict(self) -> dict:
        return {"pid": self.pid, "start": self.start, "state": self.state, "name": self.name,
                "what": self.describe()}


def with_command(process: Process) -> Process:
    return dataclasses.replace(process, command=process.command or command_line(process.pid))


def parse_stat(pid: int, text: str) -> Process:
    """/proc/<pid>/stat. The name sits in parentheses and may itself hold spaces or ')': split after the last."""
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    # After the name: state (field 3), ppid (4), ..., starttime (22).
    return Process(pid=pid, start=int(fields[19]), ppid=int(fields[1]), state=fields[0],
                   name=head.partition("(")[2])


def read(pid: int) -> Process | None:
    """The process with this pid now (a zombie included), or None."""
    try:
        with open(f"{PROC}/{pid}/stat") as fh:
            return parse_stat(pid, fh.read())
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:  # gone between open and read, or a kernel thread we may not read
        return None


def command_line(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def environment_value(pid: int, name: str) -> str | None:
    """The value of `name` in the environment the process started with (/proc/<pid>/environ), or None."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def snapshot() -> list[Process]:
    """Every process on the machine (that this pid namespace shows)."""
    found = []
    for entry in os.listdir(PROC):
        if entry.isdigit():
            process = read(int(entry))
            if process is not None:
                found.append(process)
    return found


def descendants(root: int, table: Iterable[Process]) -> list[Process]:
    """The children of `root`, theirs, and so on, in `table` (a snapshot), parents before children."""
    children: dict[int, list[Process]] = {}
    for process in table:
        children.setdefault(process.ppid, []).append(process)
    found, queue = [], list(children.get(root, []))
    while queue:
        process = queue.pop(0)
        found.append(process)
        queue.extend(children.get(process.pid, []))
    return found


def current(process: Process) -> Process | None:
    """`process` as it is now: None once it has ended (a zombie counts) or its pid belongs to another."""
    now = read(process.pid)
    if now is None or now.start != process.start or now.ended:
        return None
    return now


def alive(process: Process) -> bool:
    return current(process) is not None


def send(process: Process, sig: int) -> bool:
    """Signal `process` and no other; False when it had already ended."""
    try:
        fd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd (a kernel before 5.3): the pid, checked just before
        return current(process) is not None and _kill(process.pid, sig)
    try:
        # The pidfd holds the pid: if the start time still matches now, the signal goes to this process.
        if current(process) is None:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def _kill(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
