"""The frozen watch: which stopped processes are overdue (a table), and a real stopped process killed and named
while a running and a traced-looking one are left."""
import signal
import subprocess

import pytest

from polling import wait_for
from ringflow.training.core.backends.processes import proc
from ringflow.training.core.backends.processes.frozen_watch import FrozenWatch, overdue, still_stopped


def process(pid: int, state: str) -> proc.Process:
    return proc.Process(pid=pid, start=pid * 10, ppid=1, state=state)


@pytest.mark.parametrize("since, now, limit, expected", [
    ({}, 100.0, 10.0, []),
    ({(1, 10): 95.0}, 100.0, 10.0, []),                   # stopped 5 s of 10
    ({(1, 10): 90.0}, 100.0, 10.0, [(1, 10)]),            # exactly the limit
    ({(1, 10): 80.0, (2, 20): 99.0}, 100.0, 10.0, [(1, 10)]),
])
def test_overdue(since, now, limit, expected):
    assert overdue(since, now, limit) == expected


@pytest.mark.parametrize("since, members, expected", [
    ({}, [process(1, "T"), process(2, "S")], {(1, 10): 50.0}),           # first seen stopped: now
    ({(1, 10): 20.0}, [process(1, "T")], {(1, 10): 20.0}),               # still stopped: keeps its time
    ({(1, 10): 20.0}, [process(1, "R")], {}),                            # runs again: forgotten
    ({(1, 10): 20.0}, [], {}),                                           # gone
    ({}, [process(3, "t"), process(4, "D"), process(5, "Z")], {}),       # traced, in I/O, ended: not stopped
])
def test_still_stopped(since, members, expected):
    assert still_stopped(since, members, 50.0) == expected


@pytest.mark.job
def test_a_stopped_process_is_killed_once_overdue():
    stopped, running = (subprocess.Popen(["sleep", "300"]) for _ in range(2))
    try:
        stopped.send_signal(signal.SIGSTOP)
        assert wait_for(lambda: proc.read(stopped.pid).state == "T", timeout=10)
        members = lambda: [p for p in (proc.read(stopped.pid), proc.read(running.pid)) if p and not p.ended]
        clock = iter([0.0, 5.0, 12.0])
        said = []
        watch = FrozenWatch(members, 10.0, said.append, clock=lambda: next(clock))
        assert watch.look() == [] and watch.look() == []   # seen stopped at 0 s; 5 s of 10
        (killed,) = watch.look()
        assert killed.pid == stopped.pid and stopped.wait(timeout=10) == -signal.SIGKILL
        assert running.poll() is None
        (line,) = said
        assert f"pid {stopped.pid} (T stopped) sleep 300 was stopped for 12 s" in line, line
        assert "elastic.peer_timeout_seconds (10 s): killed" in line, line
    finally:
        for p in (stopped, running):
            p.kill()
            p.wait()
