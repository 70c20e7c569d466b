"""The launcher's eye on its ranks' memory: a local rank the kernel's OOM killer ended, which can print nothing
(an OOM a rank caught, it says in the log itself: health/verdict_line.py).

The kernel's OOM killer SIGKILLs its victim: no handler runs, nothing is written. So each rank says, when
training starts, which process it is, its memory cgroup and that cgroup's OOM-kill count (the rank's
MEMORY_LINE, health/memory_limits.py). While the job runs this watch looks every POLL_SECONDS: a rank whose
process has gone while its cgroup's OOM-kill count rose since it spoke was ended by the OOM killer. Looking
while the job runs matters: the survivors are stopped by the launcher (horovodrun, torchrun) a moment after
the victim dies, and once every rank is gone, ranks that share one memory cgroup can no longer be told apart
(then the verdict names them all and no single rank). The step is the one after the last that rank 0's
heartbeat or health records show (the ranks move in step through their all-reduce).
"""
from __future__ import annotations

import threading
from typing import Callable

from . import proc
from .poller import Poller
from .proc import Process
from ....health.memory_limits import MemoryLimits, memories_in_log, oom_kills
from ....health.oom import KERNEL_OOM_KILLER, MemoryEvidence, oom_verdict
from ....health.oom_advice import JobShape
from ....health.verdict import Verdict

POLL_SECONDS = 0.2


class OomWatch:
    """Fed the job's log lines (`feed`), it keeps what each rank said of its memory and the OOM verdict
    `look` found (a rank gone, its cgroup's OOM-kill count up).
    `running()` looks every POLL_SECONDS on a thread of its own while the job runs."""

    def __init__(self, shape: JobShape | None, heartbeat_step: Callable[[], int | None] = lambda: None):
        """heartbeat_step: the last step rank 0 completed as its heartbeat or records show (None if none),
        read once a rank is found killed."""
        self._shape, self._heartbeat_step = shape, heartbeat_step
        self._ranks: dict[int, MemoryLimits] = {}
        self._lock = threading.Lock()
        self._verdict: Verdict | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self._verdict

    def feed(self, line: str) -> None:
        memories = [m for m in memories_in_log(line) if m.rank is not None]
        if memories:
            with self._lock:
                self._ranks.update((m.rank, m) for m in memories)

    def _found(self, verdict: Verdict) -> None:
        with self._lock:
            if self._verdict is None:
                self._verdict = verdict

    def look(self) -> Verdict | None:
        """Whether the kernel's OOM killer ended a rank since it spoke; the verdict if so (kept)."""
        with self._lock:
            ranks = dict(self._ranks)
        killed = {}
        for rank, memory in sorted(ranks.items()):
            if memory.cgroup is None or memory.oom_kills is None:
                continue
            gone = proc.current(Process(pid=memory.pid, start=memory.start, ppid=0, state="?")) is None
            now = oom_kills(memory.cgroup) if gone else None
            if gone and now is not None and now > memory.oom_kills:
                killed[rank] = memory
        if not killed or self._verdict is not None:
            return self._verdict
        cgroups = {m.cgroup for m in ranks.values()}
        sharing = {r for r, m in ranks.items() if m.cgroup in {k.cgroup for k in killed.values()}}
        rank = next(iter(killed)) if len(killed) == 1 or len(cgroups) == len(ranks) else None
        memory = killed[rank] if rank is not None else next(iter(killed.values()))
        step = self._heartbeat_step()
        message = f"SIGKILLed; the OOM-kill count of memory cgroup {memory.cgroup} rose"
        if rank is None:
            message += f"; ranks {sorted(sharing)} share it and all had gone when seen, so which is not known"
        evidence = MemoryEvidence(KERNEL_OOM_KILLER, rank, step + 1 if step is not None else None,
                                  seen_by="the launcher (the rank's memory cgroup)",
                                  limit_bytes=memory.cgroup_limit_bytes,
                                  limit_source=f"memory cgroup {memory.cgroup}"
                                  if memory.cgroup_limit_bytes is not None else None,
                                  peak_rss_bytes=None, message=message)
        self._found(oom_verdict(evidence, self._shape))
        return self._verdict

    def running(self) -> Poller:
        """While in this context, `look` every POLL_SECONDS on a thread; once more on the way out."""
        return Poller(lambda: self.look() is not None, POLL_SECONDS, "ringflow-oom-watch", look_on_exit=True)
