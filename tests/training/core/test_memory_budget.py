"""How much memory a step may still take: its memory cgroup's limit (v1 or v2, the chain above included) minus
the anonymous memory in use there, or the machine's MemAvailable; read from fake /proc and cgroup trees."""
from __future__ import annotations

import pathlib

import pytest

from ringflow.training.core.memory_budget import available_memory

MiB = 2**20
UNLIMITED_V1 = 9223372036854771712


def _tree(tmp_path: pathlib.Path, proc_cgroup: str, files: dict[str, str], mem_available_mib: int = 20_000):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(proc_cgroup)
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {mem_available_mib * 1024} kB\n")
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(proc), str(root)


def _v1_stat(limit: int, rss: int, shmem: int = 0, cache: int = 0) -> str:
    return (f"cache {cache}\nrss {rss}\nhierarchical_memory_limit {limit}\ntotal_cache {cache}\n"
            f"total_rss {rss}\ntotal_shmem {shmem}\n")


# (/proc/self/cgroup, cgroup files, MemAvailable MiB) -> MiB available
CASES = [
    # v1, limited: the limit less the anonymous memory; the page cache does not count (it is reclaimed first)
    ("4:memory:/pod/task\n", {"memory/pod/task/memory.stat": _v1_stat(512 * MiB, 200 * MiB, 10 * MiB, 900 * MiB)},
     20_000, 302),
    # v1, no limit: the machine's MemAvailable
    ("4:memory:/\n", {"memory/memory.stat": _v1_stat(UNLIMITED_V1, 200 * MiB)}, 3_000, 3_000),
    # v1 inside a cgroup namespace: /proc names the host's path, the mount's root is the container's cgroup
    ("4:memory:/kubepods/pod1/c1\n", {"memory/memory.stat": _v1_stat(1024 * MiB, 24 * MiB)}, 20_000, 1_000),
    # v2: each level has its own limit; the tightest room wins (the parent's, here)
    ("0::/pod/task\n", {"pod/memory.max": str(600 * MiB), "pod/memory.stat": f"anon {500 * MiB}\nfile 1\n",
                        "pod/task/memory.max": str(512 * MiB), "pod/task/memory.stat": f"anon {100 * MiB}\n"},
     20_000, 100),
    ("0::/pod/task\n", {"pod/memory.max": "max", "pod/task/memory.max": "max"}, 2_500, 2_500),
    # more taken than the limit allows (another process of the cgroup): nothing, not a negative number
    ("0::/task\n", {"task/memory.max": str(100 * MiB), "task/memory.stat": f"anon {150 * MiB}\n"}, 20_000, 0),
    # no cgroup file at all: the machine
    ("", {}, 1_234, 1_234),
]


@pytest.mark.parametrize("proc_cgroup, files, mem_available, expected_mib", CASES)
def test_the_room_left_is_the_tightest_limit_less_what_is_in_use(tmp_path, proc_cgroup, files, mem_available,
                                                                 expected_mib):
    proc, root = _tree(tmp_path, proc_cgroup, files, mem_available)
    assert available_memory(proc=proc, cgroup_root=root) == expected_mib * MiB


def test_this_process_has_some_room():
    assert available_memory() > 0
