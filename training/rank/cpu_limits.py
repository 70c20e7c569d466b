"""The CPUs this process may actually use, as the host says: its affinity mask and its cgroup's CPU quota.

A pod does not get the node: its cgroup cpuset (Kubernetes' static CPU manager, a container runtime's
--cpuset-cpus) narrows the affinity mask every process in it starts with, and its CPU limit becomes a CFS
quota (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us, v2 cpu.max) that throttles it once it has used that
many cores' worth of time in a period, however many CPUs it may run on. os.cpu_count() sees neither.
Read-only; the decision on what to do with them is cores.py's.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Iterable, Iterator

SYSFS_CPUS = "/sys/devices/system/cpu"
PROC_CGROUP = "/proc/self/cgroup"
PROC_MOUNTINFO = "/proc/self/mountinfo"


def host_cpu_count() -> int:
    """The CPUs online on the host, however few this process may use (a container sees the host's)."""
    return os.cpu_count() or 1


def usable_cpus(sysfs_cpus: str = SYSFS_CPUS) -> tuple[int, ...]:
    """The CPUs this process may run on (its affinity mask, which the cgroup cpuset bounds), ordered so that
    the hardware threads of one core are next to each other (by_core)."""
    return by_core(os.sched_getaffinity(0), sysfs_cpus)


def by_core(cpus: Iterable[int], sysfs_cpus: str = SYSFS_CPUS) -> tuple[int, ...]:
    """`cpus` ordered by (package, core, number). Kernels number a core's second hardware thread far from its
    first (0-3 and 4-7 on a 4-core host with SMT), so consecutive numbers given to two ranks would put both
    on the same physical cores; consecutive CPUs in this order share a core only with each other. Without
    topology in sysfs (some containers), by number."""
    def key(cpu: int) -> tuple[int, int, int]:
        topology = Path(sysfs_cpus) / f"cpu{cpu}" / "topology"
        return (int((topology / "physical_package_id").read_text()), int((topology / "core_id").read_text()), cpu)

    cpus = sorted(cpus)
    try:
        return tuple(sorted(cpus, key=key))
    except (OSError, ValueError):
        return tuple(cpus)


def cpu_quota_cores(cgroup_file: str = PROC_CGROUP, mountinfo_file: str = PROC_MOUNTINFO) -> float | None:
    """How many cores' worth of CPU time this process's cgroup may use: the smallest quota / period of its
    cgroup and every cgroup above it that this process can see, cgroup v2 and v1 alike; None when none sets a
    quota (or there is no cgroup file system to read)."""
    try:
        memberships = Path(cgroup_file).read_text().splitlines()
        mounts = list(_cgroup_mounts(Path(mountinfo_file).read_text()))
    except OSError:
        return None
    quotas = []
    for line in memberships:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not hierarchy:
            continue
        if controllers == "":  # cgroup v2: one hierarchy, its cpu controller writes cpu.max
            folders = [_folder(root, point, path) for root, point, fstype, _ in mounts if fstype == "cgroup2"]
            read = _v2_quota
        elif "cpu" in controllers.split(","):  # cgroup v1: the hierarchy the cpu controller is mounted on
            folders = [_folder(root, point, path) for root, point, fstype, options in mounts
                       if fstype == "cgroup" and "cpu" in options]
            read = _v1_quota
        else:
            continue
        for folder, point in folders[:1]:
            quotas += [q for q in map(read, _up_to(folder, point)) if q is not None]
    return min(quotas) if quotas else None


def _cgroup_mounts(mountinfo: str) -> Iterator[tuple[str, Path, str, set[str]]]:
    """(root within the hierarchy, mount point, file system type, super options) of each cgroup mount
    (proc(5): '36 35 98:0 ROOT POINT rw,noatime - TYPE SOURCE OPTIONS')."""
    for line in mountinfo.splitlines():
        mine, _, theirs = line.partition(" - ")
        fields, fs = mine.split(), theirs.split()
        if len(fields) >= 5 and len(fs) >= 3 and fs[0] in ("cgroup", "cgroup2"):
            yield _unescape(fields[3]), Path(_unescape(fields[4])), fs[0], set(fs[2].split(","))


def _unescape(field: str) -> str:
    # mountinfo writes a space, tab, newline or backslash in a path as an octal escape (\040).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _folder(root: str, point: Path, path: str) -> tuple[Path, Path]:
    """The folder of cgroup `path` under a mount of the hierarchy from `root`, and the mount point. A path
    outside the mounted part (a container's view of a cgroup it was moved out of) reads at the mount point."""
    relative = os.path.relpath(path, root)
    if relative == "." or relative.startswith(".."):
        return point, point
    return point / relative, point


def _up_to(folder: Path, point: Path) -> Iterator[Path]:
    """`folder` and each folder above it up to the mount point: a parent's quota bounds its children."""
    yield folder
    while folder != point and point in folder.parents:
        folder = folder.parent
        yield folder


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()  # "max 100000" or "150000 100000"
    except (OSError, ValueError):
        return None
    return None if quota == "max" else _cores(quota, period)


def _v1_quota(folder: Path) -> float | None:
    try:
        quota, period = ((folder / name).read_text().strip() for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    except OSError:
        return None
    return None if quota == "-1" else _cores(quota, period)


def _cores(quota: str, period: str) -> float | None:
    try:
        cores = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return cores if cores > 0 and math.isfinite(cores) else None
