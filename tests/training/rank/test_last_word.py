"""SIGTERM's last word (rank/last_word.py) on a real process: the main thread blocked in a system call (as a
rank's training thread is in a collective) does not keep the records from being written, the process ends
143, and a child forked from it ends on its own SIGTERM without taking its parent along."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.job

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from ringflow.training.rank.last_word import on_sigterm

    out = sys.argv[1]
    on_sigterm(lambda: open(out + ".records", "w").write("written"), lambda line: print(line, flush=True))
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    print(f"child {os.waitstatus_to_exitcode(status)}", flush=True)
    reading, _ = os.pipe()
    print("blocked", flush=True)
    os.read(reading, 1)  # blocks for ever
""")


def test_sigterm_writes_the_records_from_a_thread_while_the_main_thread_is_blocked(tmp_path):
    out = tmp_path / "marks"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == f"child {-signal.SIGTERM}"  # the child's own default
        assert proc.stdout.readline().strip() == "blocked"
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert "SIGTERM: writing the health records not yet written" in proc.stdout.read()
        assert (tmp_path / "marks.records").read_text() == "written"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.pure
def test_a_rank_s_result_is_written_under_the_lock_sigterm_s_last_word_waits_on():
    """A rank ending on a verdict writes its records and result.json while torchrun's SIGTERM may come (its peer
    ended first): SIGTERM's thread (an elastic DDP rank's write_records) takes ENDING before it ends the process,
    so it waits for both writes."""
    import types

    from ringflow.training.rank.last_word import ENDING
    from ringflow.training.rank.rank_run import RankRun

    seen = []

    class Log:
        def append(self, rec):
            seen.append(("append", ENDING.locked()))

        def close(self):
            seen.append(("close", ENDING.locked()))

    class Guard:
        def publish_result(self, data):
            seen.append(("publish", ENDING.locked()))

    class Ending(RankRun):
        def __init__(self):
            self.guard, self.health_log = Guard(), Log()

        def result(self, status, verdict, checkpoint):
            return types.SimpleNamespace(step=3, to_json=lambda: b"{}")

    Ending().write_result("failed", None, None)
    assert seen == [("append", True), ("close", True), ("publish", True)] and not ENDING.locked()
