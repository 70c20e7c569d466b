"""The memory a process has, as far as it can be read from inside it: its memory cgroup's limit (v1
`memory.limit_in_bytes`, v2 `memory.max`) and OOM-kill count, its RLIMIT_AS, its peak resident set.

Torch-free: a TensorFlow rank reads it the same way. A rank reads it once when training starts and says it
in its log (`MemoryLimits.line`), because once the kernel's OOM killer has SIGKILLed it, nothing can be read
from the dead process: the launcher outside keeps what the rank said and compares the cgroup's OOM-kill
count then and after (core/backends/processes/oom_watch.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import resource
from typing import Any

CGROUP_ROOT = "/sys/fs/cgroup"
# A v1 limit this large means "no limit" (the kernel writes PAGE_COUNTER_MAX pages, rounded).
UNLIMITED_V1 = 2**62
# The line a rank prints when training starts; the launcher's OomWatch reads it back (mpirun may prefix it).
MEMORY_LINE = "[ringflow] rank memory: "
_MEMORY_RE = re.compile(re.escape(MEMORY_LINE) + r"(\{.*?\})")


@dataclasses.dataclass(frozen=True)
class MemoryLimits:
    """One process's memory, read once. None where it cannot be read or there is no limit.

    cgroup: the folder of its memory cgroup; cgroup_limit_bytes: that cgroup's limit; oom_kills: how many
    processes the kernel's OOM killer had ended in it when read (a later, higher count is an OOM kill);
    rlimit_as_bytes: RLIMIT_AS; peak_rss_bytes: its own peak resident set so far. pid/start: who it is
    (start: clock ticks since boot, /proc/<pid>/stat field 22; with the pid, no other process)."""

    pid: int
    start: int
    rank: int | None = None
    cgroup: str | None = None
    cgroup_limit_bytes: int | None = None
    oom_kills: int | None = None
    rlimit_as_bytes: int | None = None
    peak_rss_bytes: int | None = None

    @classmethod
    def read(cls, rank: int | None = None) -> "MemoryLimits":
        cgroup = own_memory_cgroup()
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        return cls(pid=os.getpid(), start=_start_ticks(os.getpid()), rank=rank, cgroup=cgroup,
                   cgroup_limit_bytes=cgroup_limit(cgroup) if cgroup else None,
                   oom_kills=oom_kills(cgroup) if cgroup else None,
                   rlimit_as_bytes=None if soft == resource.RLIM_INFINITY else soft,
                   peak_rss_bytes=peak_rss_bytes())

    @property
    def limit(self) -> tuple[int, str] | None:
        """(the tightest limit, what it is), or None when none is set."""
        found = []
        if self.cgroup_limit_bytes is not None:
            found.append((self.cgroup_limit_bytes, f"memory cgroup {self.cgroup}"))
        if self.rlimit_as_bytes is not None:
            found.append((self.rlimit_as_bytes, "RLIMIT_AS, the address space"))
        return min(found) if found else None

    def line(self) -> str:
        return MEMORY_LINE + json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "MemoryLimits":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def memories_in_log(line: str) -> list[MemoryLimits]:
    """What ranks said of their memory in `line`: each MEMORY_LINE in it (as printed, or prefixed by mpirun,
    which runs one rank's output into another's line when they write at once)."""
    found = []
    for match in _MEMORY_RE.finditer(line):
        try:
            found.append(MemoryLimits.from_dict(json.loads(match.group(1))))
        except (ValueError, TypeError):
            continue
    return found


def own_memory_cgroup(proc_cgroup: str = "/proc/self/cgroup", root: str = CGROUP_ROOT) -> str | None:
    """The folder of this process's memory cgroup (v1 `memory` hierarchy, else v2), None if none shows."""
    try:
        with open(proc_cgroup) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = os.path.join(root, "memory", path.lstrip("/"))
            # In a cgroup namespace the path may not show under the mount: its root is this process's.
            for candidate in (folder, os.path.join(root, "memory")):
                if os.path.exists(os.path.join(candidate, "memory.limit_in_bytes")):
                    return candidate
    for line in lines:
        if line.startswith("0::"):
            folder = os.path.join(root, line[3:].lstrip("/"))
            if os.path.exists(os.path.join(folder, "memory.max")):
                return folder
    return None


def cgroup_limit(folder: str) -> int | None:
    """The memory limit of the cgroup in `folder` (v1 or v2), None when it has none or it is gone."""
    for name in ("memory.limit_in_bytes", "memory.max"):
        try:
            with open(os.path.join(folder, name)) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text == "max":
            return None
        value = int(text)
        return None if value >= UNLIMITED_V1 else value
    return None


def oom_kills(folder: str) -> int | None:
    """How many processes the kernel's OOM killer has ended in the cgroup: v1 memory.oom_control's
    `oom_kill` (Linux 4.13+), v2 memory.events' `oom_kill`. None when neither can be read."""
    for name in ("memory.oom_control", "memory.events"):
        try:
            with open(os.path.join(folder, name)) as fh:
                text = fh.read()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (getrusage's ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[19])
