"""How much more memory this process can take before a limit stops it.

In a container (an Airflow worker pod, an MPIJob launcher) the memory cgroup's limit, not the machine's memory or
its cores, is what OOM-kills a task, so a step that chooses its parallelism (the shard step's writer threads)
asks this first. Only anonymous memory counts as taken: the kernel reclaims a cgroup's page cache (files read
and written) before it kills anything, and the data steps write far more than their limit through it
(measured: bench/data_memory.py).
"""
from __future__ import annotations

import os
import pathlib

CGROUP_ROOT = "/sys/fs/cgroup"
# A limit at or above this is "no limit" (cgroup v1 writes 2^63 rounded down to a page).
_UNLIMITED = 1 << 60


def available_memory(proc: str = "/proc", cgroup_root: str = CGROUP_ROOT) -> int:
    """Bytes this process can still allocate: the least of the machine's MemAvailable and, for its memory
    cgroup and each one above it with a limit, that limit minus the anonymous memory in use there."""
    room = [_mem_available(pathlib.Path(proc) / "meminfo")]
    try:
        lines = (pathlib.Path(proc) / "self" / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    root = pathlib.Path(cgroup_root)
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1: one file says the limit of the whole chain
            folder = _existing(root / "memory" / path.lstrip("/"), root / "memory")
            stat = _stat(folder / "memory.stat")
            if stat.get("hierarchical_memory_limit", _UNLIMITED) < _UNLIMITED:
                room.append(stat["hierarchical_memory_limit"] - stat.get("total_rss", 0) - stat.get("total_shmem", 0))
            break
        if line.startswith("0::"):  # cgroup v2: each level has its own memory.max
            folder = _existing(root / path.lstrip("/"), root)
            for level in (folder, *folder.parents):
                if level == root.parent:
                    break
                limit = _read(level / "memory.max")
                if limit and limit != "max" and int(limit) < _UNLIMITED:
                    stat = _stat(level / "memory.stat")
                    room.append(int(limit) - stat.get("anon", 0) - stat.get("shmem", 0))
    return max(0, min(room))


def _existing(path: pathlib.Path, fallback: pathlib.Path) -> pathlib.Path:
    """The cgroup's folder, or the mount's root inside a cgroup namespace (where /proc shows the host's path)."""
    return path if path.is_dir() else fallback


def _read(path: pathlib.Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _stat(path: pathlib.Path) -> dict[str, int]:
    values = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return values


def _mem_available(meminfo: pathlib.Path) -> int:
    for line in _read(meminfo).splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
