"""The stop sequence on real processes: every member ends, in whatever state, and the check names any
that would not."""
import signal
import subprocess

import pytest

from polling import wait_for
from ringflow.training.core.backends.processes import proc
from ringflow.training.core.backends.processes.stop import ProcessesRemain, grace_from_env, stop_processes
from ringflow.training.core.backends.processes.tracking import start_tracking

# Each member writes "<role> <pid>" to the file in $1: one that ignores SIGTERM in a session of its own, an
# orphan (its parent subshell exits), one stopped with SIGSTOP, and a plain one; then the script waits.
UNRULY = """
setsid bash -c 'trap "" TERM; echo ignorer $$ >> "$1"; exec sleep 300' _ "$1" &
( sleep 300 & echo orphan $! >> "$1" ) &
sleep 300 & echo stopped $! >> "$1"; kill -STOP $!
sleep 300 & echo plain $! >> "$1"
wait
"""


def roles(path) -> dict[str, proc.Process]:
    found = {}
    for line in path.read_text().splitlines():
        role, pid = line.split()
        found[role] = proc.read(int(pid))
    return found


@pytest.mark.job
def test_every_member_ends_whatever_it_does(tmp_path, tracking_mode):
    """...and the owner's other children (here: the test runner's, as its S3 server) are left alone."""
    pids = tmp_path / "pids"
    bystander = subprocess.Popen(["sleep", "300"])  # the owner's own child, not the tracker's
    with start_tracking("unruly", tracking_mode) as tracker:
        try:
            shell = tracker.spawn(["bash", "-c", UNRULY, "_", str(pids)])
            assert wait_for(lambda: pids.exists() and len(pids.read_text().splitlines()) == 4, timeout=30)
            members = roles(pids)
            assert wait_for(lambda: proc.read(members["stopped"].pid).state == "T", timeout=30)
            assert {p.pid for p in members.values()} | {shell.pid} <= {p.pid for p in tracker.members()}

            outcome = stop_processes(tracker, grace_seconds=0.5)

            assert outcome.clean and not tracker.members()
            assert all(proc.current(p) is None for p in members.values())
            killed = {p.pid for p in outcome.killed}
            assert members["ignorer"].pid in killed and members["stopped"].pid in killed, outcome.describe()
            assert {members["orphan"].pid, members["plain"].pid} <= {p.pid for p in outcome.terminated}
            assert "killed: " in outcome.describe() and f"pid {members['ignorer'].pid} " in outcome.describe()
            shell.wait(5)
            assert bystander.poll() is None and bystander.pid not in {p.pid for p in tracker.members()}
        finally:
            stop_processes(tracker, 0, kill_wait_seconds=5)
            assert tracker.release(2.0)
            bystander.kill()
            bystander.wait(5)


@pytest.mark.job
def test_the_last_are_waited_for_then_killed_after_the_members(tmp_path):
    """`last` (the supervisor, outside the set) gets no SIGTERM: it is waited for, then killed."""
    outside = subprocess.Popen(["sleep", "300"])
    try:
        with start_tracking("last", "subreaper") as tracker:
            member = tracker.spawn(["sleep", "300"])
            outcome = stop_processes(tracker, grace_seconds=0.3, last=[proc.read(outside.pid)])
            assert [p.pid for p in outcome.terminated] == [member.pid]
            assert [p.pid for p in outcome.killed] == [outside.pid]
            assert outside.wait(5) == -signal.SIGKILL and member.wait(5) == -signal.SIGTERM
    finally:
        outside.kill()


@pytest.mark.job
def test_a_process_that_will_not_go_is_named_with_its_state(monkeypatch):
    """As a process in uninterruptible sleep would: here the signals to it are withheld."""
    with start_tracking("stuck", "subreaper") as tracker:
        stuck = tracker.spawn(["sleep", "300"])
        send = proc.send
        try:
            monkeypatch.setattr(proc, "send", lambda p, sig: False if p.pid == stuck.pid else send(p, sig))
            outcome = stop_processes(tracker, grace_seconds=0.1, kill_wait_seconds=0.3)
            assert [p.pid for p in outcome.remaining] == [stuck.pid] and not outcome.clean
            error = str(ProcessesRemain("stopping local job 'rf-x'", outcome, 0.3))
            assert error.startswith(f"stopping local job 'rf-x': 1 process(es) still alive 0.3 s after SIGKILL: "
                                    f"pid {stuck.pid} (S sleeping) sleep 300.")
            assert "uninterruptible sleep (D)" in error
        finally:
            stuck.kill()
            stuck.wait()


@pytest.mark.parametrize("environ, expected", [
    ({}, 10.0), ({"RINGFLOW_STOP_GRACE_SECONDS": "2.5"}, 2.5), ({"RINGFLOW_STOP_GRACE_SECONDS": "0"}, 0.0),
])
def test_grace_from_env(environ, expected):
    assert grace_from_env(environ) == expected


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_grace_names_the_variable(value):
    with pytest.raises(ValueError, match=r"\$RINGFLOW_STOP_GRACE_SECONDS is .*seconds between SIGTERM and SIGKILL"):
        grace_from_env({"RINGFLOW_STOP_GRACE_SECONDS": value})
