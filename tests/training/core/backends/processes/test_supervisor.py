"""The process a local job runs under: it tracks the job's processes, stops what the job leaves behind,
stops everything on SIGTERM, and writes the exit status last."""
import json
import os
import signal
import subprocess
import sys

import pytest

from polling import wait_for
from ringflow.training.core.backends.processes import proc
from ringflow.training.core.backends.processes.supervise import shell_status

# Leaves a process in a session of its own that ignores SIGTERM (its pid in $1), then exits with 3.
LEAVES_A_STRAY = """setsid bash -c 'trap "" TERM; echo $$ > "$1"; exec sleep 300' _ "$1" &
while [ ! -s "$1" ]; do sleep 0.05; done; exit 3"""
# Starts children in sessions of their own (pids in $1), then waits.
WAITS = """for i in 1 2; do setsid bash -c 'echo $$ >> "$1"; exec sleep 300' _ "$1" & done; wait"""


def supervise(job_dir, mode, script, *args):
    job_dir.mkdir(exist_ok=True)
    log = open(job_dir / "output.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "ringflow.training.core.backends.processes.supervise", "--job-dir",
                             str(job_dir), "--tracking", mode, "--grace", "0.5", "--", "bash", "-c", script, "_",
                             *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.job
def test_what_the_job_leaves_is_stopped_and_named_before_the_exit_status(tmp_path, tracking_mode, janitor):
    job_dir, stray_pid = tmp_path / "job", tmp_path / "stray"
    supervisor = supervise(job_dir, tracking_mode, LEAVES_A_STRAY, str(stray_pid))
    assert wait_for(lambda: stray_pid.exists() and stray_pid.read_text().strip(), timeout=30)
    stray = proc.read(int(stray_pid.read_text()))
    assert supervisor.wait(30) == 3
    assert (job_dir / "exit_code").read_text() == "3\n"
    assert proc.current(stray) is None
    log = (job_dir / "output.log").read_text()
    assert f"1 process(es) outlived the job's launcher and were stopped: killed: pid {stray.pid} (" in log, log
    record = json.loads((job_dir / "processes.json").read_text())
    assert record["supervisor"]["pid"] == supervisor.pid and record["tracking"]["mode"] == tracking_mode
    assert not os.path.exists(record["tracking"].get("path", "/nonexistent"))


@pytest.mark.job
def test_sigterm_to_the_supervisor_stops_every_process_of_the_job(tmp_path, tracking_mode, janitor):
    job_dir, pids = tmp_path / "job", tmp_path / "pids"
    supervisor = supervise(job_dir, tracking_mode, WAITS, str(pids))
    assert wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, timeout=30)
    children = [proc.read(int(pid)) for pid in pids.read_text().split()]
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 128 + signal.SIGTERM  # the job's status: bash, ended by SIGTERM
    assert all(proc.current(child) is None for child in children)
    assert (job_dir / "exit_code").read_text() == f"{128 + signal.SIGTERM}\n"
    assert "stop requested (signal 15)" in (job_dir / "output.log").read_text()


@pytest.mark.parametrize("returncode, status", [(0, 0), (3, 3), (-signal.SIGKILL, 137), (-signal.SIGTERM, 143)])
def test_shell_status(returncode, status):
    assert shell_status(returncode) == status
