"""Run a command inside a memory cgroup of its own and measure it: the one cgroup helper of the memory tests
(tests/training/test_data_memory.py) and the memory benchmark (bench/data_memory.py).

A limit only proves something when the kernel enforces it, so this uses a real memory cgroup, not
RLIMIT_AS (which counts address space Arrow and numpy reserve but never touch) or a watcher process. The
cgroup is created below the caller's own memory cgroup (nested, so it also stays inside whatever limit the
caller already has) and removed afterwards, whatever happened. cgroup v1 (these machines) and v2 (where the
caller's cgroup delegates the memory controller to its children) are both handled; anything else raises
CgroupUnavailable with the reason, for a test to skip on and a benchmark to exit with.

What counts against the limit (and against the cgroup's peak): the process's memory and the page cache it
charges, which includes the pages of files it writes until the kernel reclaims them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Iterator, Mapping, Sequence

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
MiB = 2**20
ANON_SAMPLE_S = 0.02


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be made here; the message says why and what would fix it."""


@dataclasses.dataclass(frozen=True)
class Measured:
    """One command's run inside a memory cgroup."""

    returncode: int
    oom_kills: int  # processes the kernel's OOM killer ended inside the cgroup
    wall_s: float
    cpu_s: float  # user + system seconds of the process (and the children it waited for)
    peak_rss_bytes: int  # the process's own peak resident set (wait4's ru_maxrss), mapped files included
    cgroup_peak_bytes: int  # the cgroup's peak usage: the process plus the page cache it charged
    anon_peak_bytes: int  # the cgroup's anonymous memory at its highest, sampled: what cannot be reclaimed
    limit_bytes: int
    stdout: str
    stderr: str

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.oom_kills

    @property
    def outcome(self) -> str:
        return "pass" if self.passed else ("OOM" if self.oom_kills else f"exit {self.returncode}")

    def summary(self) -> dict:
        return {"outcome": self.outcome, "returncode": self.returncode, "oom_kills": self.oom_kills,
                "wall_s": round(self.wall_s, 2), "cpu_s": round(self.cpu_s, 2),
                "peak_rss_mib": round(self.peak_rss_bytes / MiB, 1),
                "cgroup_peak_mib": round(self.cgroup_peak_bytes / MiB, 1),
                "anon_peak_mib": round(self.anon_peak_bytes / MiB, 1), "limit_mib": round(self.limit_bytes / MiB)}


def _own_memory_cgroup() -> tuple[int, pathlib.Path]:
    """(cgroup version, folder of this process's memory cgroup)."""
    if os.geteuid() != 0:
        raise CgroupUnavailable("creating a memory cgroup needs root; run as root (or in a container that "
                                "delegates a cgroup to this user)")
    try:
        lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read /proc/self/cgroup ({exc}); cgroups are not available") from exc
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = CGROUP_ROOT / "memory" / path.lstrip("/")
            if (folder / "memory.limit_in_bytes").exists():
                return 1, folder
            if (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists():  # a cgroup namespace: its root
                return 1, CGROUP_ROOT / "memory"
    for line in lines:
        if line.startswith("0::"):
            folder = CGROUP_ROOT / line[3:].lstrip("/")
            if not folder.is_dir():
                folder = CGROUP_ROOT
            try:
                delegated = (folder / "cgroup.subtree_control").read_text().split()
            except OSError:
                delegated = []
            if "memory" in delegated:
                return 2, folder
            raise CgroupUnavailable(f"cgroup v2 at {folder} does not delegate the memory controller to its "
                                    "children (cgroup.subtree_control has no 'memory'); enable it there")
    raise CgroupUnavailable("no memory cgroup controller is mounted under /sys/fs/cgroup")


class MemoryCgroup:
    """A cgroup with a memory limit (swap included where the kernel accounts it), for `run`."""

    def __init__(self, version: int, path: pathlib.Path, limit_bytes: int) -> None:
        self.version, self.path, self.limit_bytes = version, path, limit_bytes

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def _counter(self, file: str, key: str) -> int:
        for line in self._read(file).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
        return 0

    def peak_bytes(self) -> int:
        return int(self._read("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"))

    def reset_peak(self) -> None:
        # v1: writing to max_usage resets it; v2: memory.peak is per cgroup and this one is fresh per use.
        if self.version == 1:
            (self.path / "memory.max_usage_in_bytes").write_text("0")

    def anon_bytes(self) -> int:
        return self._counter("memory.stat", "total_rss") if self.version == 1 else \
            self._counter("memory.stat", "anon")

    def oom_kills(self) -> int:
        return self._counter("memory.oom_control", "oom_kill") if self.version == 1 else \
            self._counter("memory.events", "oom_kill")

    def pids(self) -> list[int]:
        return [int(p) for p in self._read("cgroup.procs").split()]

    def run(self, command: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float = 600) -> Measured:
        """Run `command` inside the cgroup (a shell puts itself in, then execs it: the command's own process
        is the one measured) and wait for it, killing it after `timeout` seconds."""
        self.reset_peak()
        kills_before = self.oom_kills()
        enter = 'echo $$ > "$0" && exec "$@"'
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            started = time.perf_counter()
            proc = subprocess.Popen(["/bin/sh", "-c", enter, str(self.path / "cgroup.procs"), *command],
                                    stdout=out, stderr=err, env=dict(env) if env is not None else None, cwd=cwd,
                                    start_new_session=True)
            timer = threading.Timer(timeout, lambda: _kill_group(proc.pid))
            timer.start()
            done = threading.Event()
            anon_peak = [0]

            def sample() -> None:  # the kernel keeps no peak of anonymous memory: look often
                while not done.wait(ANON_SAMPLE_S):
                    with contextlib.suppress(OSError, ValueError):
                        anon_peak[0] = max(anon_peak[0], self.anon_bytes())

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                # wait4, not Popen.wait: it returns the child's rusage, so the command's own peak RSS.
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                timer.cancel()
                done.set()
                sampler.join()
            wall = time.perf_counter() - started
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            return Measured(returncode=proc.returncode, oom_kills=self.oom_kills() - kills_before, wall_s=wall,
                            cpu_s=usage.ru_utime + usage.ru_stime,
                            peak_rss_bytes=usage.ru_maxrss * 1024, cgroup_peak_bytes=self.peak_bytes(),
                            anon_peak_bytes=anon_peak[0],
                            limit_bytes=self.limit_bytes, stdout=out.read(), stderr=err.read())


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int, name: str = "test") -> Iterator[MemoryCgroup]:
    """A fresh memory cgroup limited to `limit_bytes`, below this process's own; removed on the way out
    (its remaining processes killed first), even when the body raised."""
    version, parent = _own_memory_cgroup()
    path = parent / f"rf-{name}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot create a memory cgroup under {parent} ({exc})") from exc
    try:
        group = MemoryCgroup(version, path, limit_bytes)
        if version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            if (path / "memory.memsw.limit_in_bytes").exists():  # swap too, where the kernel accounts it
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        else:
            (path / "memory.max").write_text(str(limit_bytes))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
        yield group
    finally:
        _remove(path)


def _remove(path: pathlib.Path) -> None:
    """Kill what is left in the cgroup, then rmdir it (it can only go once empty)."""
    if not path.exists():
        return
    deadline = time.monotonic() + 10
    while True:
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            path.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
