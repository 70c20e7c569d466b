"""The memory-cgroup helper of the memory tests and bench/data_memory.py: the kernel enforces its limit, an OOM
kill is reported as one, and the cgroup is gone afterwards, whatever happened inside."""
from __future__ import annotations

import pathlib
import sys

import pytest

from memory_cgroup import CgroupUnavailable, memory_cgroup

pytestmark = pytest.mark.job

ALLOCATE = "import sys; data = bytearray(int(sys.argv[1]) * 2**20); data[::4096] = b'x' * len(data[::4096])"


def test_within_the_limit_it_passes_and_over_it_the_kernel_kills(tmp_path):
    try:
        with memory_cgroup(96 * 2**20, "test-helper") as group:
            fits = group.run([sys.executable, "-c", ALLOCATE, "32"])
            too_big = group.run([sys.executable, "-c", ALLOCATE, "256"])
            path = group.path
    except CgroupUnavailable as exc:
        pytest.skip(f"needs a memory cgroup of its own: {exc}")
    assert fits.passed and fits.outcome == "pass" and 32 * 2**20 <= fits.peak_rss_bytes
    assert fits.anon_peak_bytes <= fits.cgroup_peak_bytes <= 96 * 2**20
    assert not too_big.passed and too_big.outcome == "OOM" and too_big.oom_kills == 1
    assert not path.exists()


def test_the_cgroup_is_removed_when_the_body_fails():
    try:
        with pytest.raises(RuntimeError, match="the body failed"):
            with memory_cgroup(64 * 2**20, "test-helper") as group:
                path = group.path
                assert path.is_dir()
                raise RuntimeError("the body failed")
    except CgroupUnavailable as exc:
        pytest.skip(f"needs a memory cgroup of its own: {exc}")
    assert not path.exists()


def test_what_a_command_leaves_running_in_it_is_ended_with_it():
    try:
        with memory_cgroup(64 * 2**20, "test-helper") as group:
            left = group.run(["/bin/sh", "-c", "sleep 300 & exit 0"])
            stray = group.pids()
            path = group.path
    except CgroupUnavailable as exc:
        pytest.skip(f"needs a memory cgroup of its own: {exc}")
    assert left.passed and len(stray) == 1  # the sleep outlived its shell, inside the cgroup
    assert not path.exists()
    assert _gone_or_dead(stray[0])


def _gone_or_dead(pid: int) -> bool:
    """No such process, or a zombie waiting for its (new) parent to reap it."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
