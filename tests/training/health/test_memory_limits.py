"""The memory a process has (health/memory_limits.py), read from cgroup files laid out as the kernel does."""
import dataclasses
import os

import pytest

from ringflow.training.health.memory_limits import (MEMORY_LINE, MemoryLimits, cgroup_limit, memories_in_log,
                                                    oom_kills, own_memory_cgroup)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_v1_memory_cgroup_its_limit_and_oom_kills(tmp_path):
    folder = tmp_path / "memory" / "job" / "rank1"
    write(folder / "memory.limit_in_bytes", "268435456\n")
    write(folder / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    write(tmp_path / "self-cgroup", "6:freezer:/\n4:memory:/job/rank1\n0::/\n")
    assert own_memory_cgroup(str(tmp_path / "self-cgroup"), str(tmp_path)) == str(folder)
    assert cgroup_limit(str(folder)) == 256 * 2**20 and oom_kills(str(folder)) == 2


def test_a_v2_memory_cgroup(tmp_path):
    folder = tmp_path / "job.slice"
    write(folder / "memory.max", "max\n")
    write(folder / "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    write(tmp_path / "self-cgroup", "0::/job.slice\n")
    assert own_memory_cgroup(str(tmp_path / "self-cgroup"), str(tmp_path)) == str(folder)
    assert cgroup_limit(str(folder)) is None and oom_kills(str(folder)) == 1


def test_no_limit_and_nothing_to_read(tmp_path):
    write(tmp_path / "memory.limit_in_bytes", str(2**63 - 4096))
    assert cgroup_limit(str(tmp_path)) is None
    assert oom_kills(str(tmp_path / "gone")) is None and cgroup_limit(str(tmp_path / "gone")) is None
    assert own_memory_cgroup(str(tmp_path / "no-such-file")) is None


def test_this_process_and_its_line():
    me = MemoryLimits.read(rank=3)
    assert me.pid == os.getpid() and me.rank == 3 and me.peak_rss_bytes > 0
    line = "[1,3]<stderr>:" + me.line()
    assert MEMORY_LINE in line and memories_in_log(line) == [me]
    assert memories_in_log("[ringflow] step=3") == []
    # mpirun runs one rank's output into another's line when both write at once: each is read
    other = dataclasses.replace(me, rank=4, pid=me.pid + 1)
    assert memories_in_log(f"[1,0]<stderr>:{line}[1,1]<stderr>:{other.line()}") == [me, other]


@pytest.mark.parametrize("cgroup_limit_bytes, rlimit, expected", [
    (None, None, None),
    (512, None, (512, "memory cgroup /cg")),
    (None, 1024, (1024, "RLIMIT_AS, the address space")),
    (2048, 1024, (1024, "RLIMIT_AS, the address space")),
])
def test_the_tightest_limit(cgroup_limit_bytes, rlimit, expected):
    limits = MemoryLimits(pid=1, start=1, cgroup="/cg", cgroup_limit_bytes=cgroup_limit_bytes, rlimit_as_bytes=rlimit)
    assert limits.limit == expected
