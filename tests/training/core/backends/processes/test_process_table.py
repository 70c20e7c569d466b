"""Reading /proc: who a process is, its state, its descendants."""
import os

import pytest

from ringflow.training.core.backends.processes import proc
from ringflow.training.core.backends.processes.proc import Process, descendants, parse_stat


@pytest.mark.parametrize("text, expected", [
    ("42 (python3) S 7 42 42 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 123456 1000 10",
     Process(pid=42, start=123456, ppid=7, state="S", name="python3")),
    # A name may hold spaces and ')': everything up to the last ')' is the name.
    ("43 (a b) c)) T 1 43 43 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0",
     Process(pid=43, start=99, ppid=1, state="T", name="a b) c)")),
])
def test_parse_stat(text, expected):
    assert parse_stat(expected.pid, text) == expected


def p(pid, ppid, state="S"):
    return Process(pid=pid, start=pid * 10, ppid=ppid, state=state)


@pytest.mark.parametrize("table, root, expected", [
    ([p(2, 1), p(3, 2), p(4, 3), p(5, 1)], 2, [3, 4]),
    ([p(2, 1), p(3, 2), p(4, 2), p(6, 4)], 2, [3, 4, 6]),  # parents before children
    ([p(2, 1)], 2, []),
    ([p(3, 2)], 9, []),
])
def test_descendants(table, root, expected):
    assert [d.pid for d in descendants(root, table)] == expected


def test_this_process_is_read_and_described():
    me = proc.read(os.getpid())
    assert me.ppid == os.getppid() and me.state in "RS" and proc.current(me) == me
    assert me.describe().startswith(f"pid {me.pid} ({me.state} ")
    assert "pytest" in me.describe() or "python" in me.describe()
    # Another start time is another process, even with the same pid.
    assert proc.current(Process(pid=me.pid, start=me.start + 1, ppid=0, state="?")) is None
    assert proc.read(2 ** 22 + 1) is None  # above any pid_max
