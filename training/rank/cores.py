"""Each rank's share of the CPUs: the ones it binds itself to, and how many torch threads it runs.

Ranks on one host that all float over all its CPUs get in each other's way: the scheduler moves one rank's
threads onto the core the other is computing on, caches go cold, and the job goes at its slowest rank's
pace. Bound, each rank (every thread of it: the training thread, torch's pool, Horovod's background
thread, MPI's and Gloo's) runs on CPUs of its own. But a bound rank cannot step over to an idle CPU while
other work holds its own, so on a host shared with other work binding loses (bench/results/bind_cores.md):
by default ("auto") a rank binds only where the job was given CPUs of its own.

The share is computed once per rank, from what the process may actually use (cpu_limits.py: its affinity
mask, which a pod's cpuset bounds, and its cgroup's CPU quota, a pod's CPU limit), and handed on typed: the
same CpuShare binds the rank and sets its torch thread count (engine.share_host_cores). `decide_cpu_share`
is the decision, a pure function; `claim_cpu_share` reads the host, decides, binds and says so in one line.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Mapping, Sequence

from ..formats.config import BIND_CORES, BIND_CORES_AUTO, is_bind_cores
from .cpu_limits import cpu_quota_cores, host_cpu_count, usable_cpus

# torch intra-op threads per rank, instead of one per CPU of its share (bench/throughput.py measures one
# core per rank with it).
TORCH_THREADS_ENV = "RINGFLOW_TORCH_THREADS"
# What a rank's threads are called in its CPU line: torch's by default; a TensorFlow rank names its own.
TORCH_THREAD = "torch thread"
# Open MPI sets it in a rank that mpirun bound itself (mpirun without `-bind-to none`, which binds up to 2
# ranks to a core each by default): that mask is already the rank's own share.
OMPI_BOUND_ENV = "OMPI_MCA_orte_bound_at_launch"


@dataclasses.dataclass(frozen=True)
class CpuShare:
    cpus: tuple[int, ...]  # where this rank's threads run: its own CPUs when bound, else every usable one
    threads: int           # intra-op threads (torch's, or TensorFlow's): the cores' worth the rank may use, at least 1
    bound: bool            # the rank binds itself to `cpus`
    reason: str            # why, for the log line

    def describe(self, local_rank: int, local_size: int, thread: str = TORCH_THREAD) -> str:
        """One line: where the rank runs, how many `thread`s (what its library's threads are called), why."""
        where = "bound to" if self.bound else "not bound, runs on"
        return (f"local rank {local_rank} of {local_size}: {where} CPUs {cpu_list(self.cpus)}, "
                f"{_count(self.threads, thread)} ({self.reason})")


def decide_cpu_share(usable: Sequence[int], quota_cores: float | None, host_cpus: int, local_rank: int,
                     local_size: int, bind_cores: str | bool, launcher_bound: bool = False) -> CpuShare:
    """This rank's share of the CPUs its host gives the job.

    usable: the CPUs the process may run on, hardware threads of a core side by side (cpu_limits.by_core).
    quota_cores: the cgroup's CPU quota in cores, None without one. host_cpus: how many CPUs the host has
    online. local_rank, local_size: this rank's index among the ranks on its host, and how many there are.
    bind_cores: the config's option. launcher_bound: the launcher already bound each rank to CPUs of its
    own (then `usable` is this rank's).

    Every rank gets the same number of CPUs (a data-parallel step waits for the slowest rank, so one more CPU
    for one rank buys nothing), consecutive ones in `usable`, and at most the quota's share: more CPUs than
    the quota pays for would only be throttled."""
    usable = tuple(usable)
    if not usable:
        raise ValueError("no usable CPUs: the process's affinity mask is empty")
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} of {local_size}: the launcher's local rank must be at least 0 "
                         f"and below its local size")
    if quota_cores is not None and not quota_cores > 0:
        raise ValueError(f"CPU quota {quota_cores!r}: give the cgroup's quota in cores (> 0), or None without one")
    if not is_bind_cores(bind_cores):
        raise ValueError(f"bind_cores {bind_cores!r}: use one of {BIND_CORES}")
    quota_per_rank = math.inf if quota_cores is None else quota_cores / local_size
    if launcher_bound:
        threads = max(1, math.floor(min(len(usable), quota_per_rank)))
        return CpuShare(usable, threads, False, "the launcher bound this rank to its CPUs (mpirun without "
                                                "-bind-to none); kept")
    floating = max(1, math.floor(min(len(usable) / local_size, quota_per_rank)))

    def unbound(reason: str) -> CpuShare:
        return CpuShare(usable, floating, False, reason)

    if bind_cores is False:
        return unbound("bind_cores is false")
    if local_size > len(usable):
        return unbound(f"{local_size} ranks on this host outnumber its {_count(len(usable), 'usable CPU')}")
    if quota_per_rank < 1:
        return unbound(f"the CPU quota of {quota_cores:g} cores is below one core for each of {local_size} ranks")
    if bind_cores == BIND_CORES_AUTO and quota_cores is not None and quota_cores < len(usable):
        # A quota smaller than the CPU set: the set is a shared pool (a pod with a CPU limit, not its own
        # cpuset), and every such pod's rank 0 would bind to the same first CPUs of it.
        return unbound(f"the CPU quota of {quota_cores:g} cores is smaller than the {len(usable)} CPUs this "
                       f"process may run on, which other pods share; bind_cores: true binds anyway")
    if bind_cores == BIND_CORES_AUTO and len(usable) >= host_cpus:
        # Every CPU of the host: shared with whatever else runs there, and a bound rank cannot step over to
        # an idle CPU while its own is busy (bound ranks ran slower here under other work,
        # bench/results/bind_cores.md). A CPU set narrower than the host was given to this job.
        return unbound(f"this process may run on all {host_cpus} CPUs of the host, which other work shares; "
                       f"bind_cores: true binds on a host the job has to itself")
    per_rank = math.floor(min(len(usable) // local_size, quota_per_rank))
    cpus = usable[local_rank * per_rank:(local_rank + 1) * per_rank]
    quota = f", within a CPU quota of {quota_cores:g} cores" if quota_cores is not None else ""
    return CpuShare(cpus, per_rank, True, f"{per_rank} of {_count(len(usable), 'usable CPU')} for each of "
                                          f"{_count(local_size, 'rank')} on this host{quota}")


def local_rank_from_env(environ: Mapping[str, str],
                        names: Sequence[tuple[str, str]]) -> tuple[int, int] | None:
    """(local rank, local size) from the first pair of launcher variables both set, before the engine's
    library is initialized (hvd.local_rank() needs hvd.init(), which starts threads); None if none is."""
    for rank_name, size_name in names:
        if rank_name in environ and size_name in environ:
            try:
                return int(environ[rank_name]), int(environ[size_name])
            except ValueError:
                raise ValueError(f"${rank_name}={environ[rank_name]!r}, ${size_name}={environ[size_name]!r}: the "
                                 f"launcher's local rank and size must be whole numbers") from None
    return None


def claim_cpu_share(bind_cores: str | bool, local_rank: int, local_size: int,
                    environ: Mapping[str, str] = os.environ, thread: str = TORCH_THREAD) -> CpuShare:
    """Decide this rank's share from what the host gives this process, bind every thread of it there when
    the share says so, and print one line saying what and why (`thread`: what its intra-op threads are). Called before the engine's library starts
    its threads; threads already running (pyarrow's, jemalloc's start at import) are bound too."""
    usable = usable_cpus()
    share = decide_cpu_share(usable, cpu_quota_cores(), host_cpu_count(), local_rank, local_size, bind_cores,
                             launcher_bound=environ.get(OMPI_BOUND_ENV) == "1")
    threads = environ.get(TORCH_THREADS_ENV)
    if threads:
        if not threads.isdigit() or int(threads) < 1:
            raise ValueError(f"${TORCH_THREADS_ENV}={threads!r}: give a whole number of threads >= 1, or unset it "
                             f"for one per CPU of the rank's share")
        share = dataclasses.replace(share, threads=int(threads), reason=f"{share.reason}; threads from "
                                                                        f"${TORCH_THREADS_ENV}")
    if share.bound:
        try:
            bind_process(share.cpus)
        except OSError as exc:  # a sandbox that forbids sched_setaffinity: train unbound rather than not at all
            with contextlib.suppress(OSError):
                bind_process(usable)  # the threads bound before the failure, back with the others
            share = dataclasses.replace(share, cpus=usable, bound=False,
                                        reason=f"binding failed ({exc.strerror or exc}); set bind_cores false to "
                                               f"not try")
    print(f"[ringflow] {share.describe(local_rank, local_size, thread)}", flush=True)
    return share


def bind_process(cpus: Sequence[int]) -> None:
    """Every thread of this process onto `cpus`. The calling thread first: a thread starts with its
    creator's mask, so what starts from here on is bound already. Then each thread already running, until a
    pass finds none new (one may have been started by a thread not yet bound)."""
    os.sched_setaffinity(0, cpus)
    done: set[int] = set()
    while fresh := {int(tid) for tid in os.listdir("/proc/self/task")} - done:
        for tid in fresh:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:  # it ended meanwhile
                pass
        done |= fresh


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def cpu_list(cpus: Sequence[int]) -> str:
    """'0-3,8' for (0, 1, 2, 3, 8), as Linux writes a CPU list (Cpus_allowed_list, taskset -c)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
