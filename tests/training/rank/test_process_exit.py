"""A script rank's exit (rank/process_exit.py): what finalization would do for the script still happens (its
non-daemon thread finishes, a thread pool's idle worker ends, its atexit handler runs, its last printed line arrives), and its code is the
process's; what finalization would tear down is skipped (a __del__ left for module teardown never runs)."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.job

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from ringflow.training.rank.process_exit import leave

    out = sys.argv[1]

    def upload():
        time.sleep(0.3)
        open(out + ".thread", "w").write("done")

    class TornDownAtFinalization:
        def __del__(self, open=open):
            open(out + ".teardown", "w").write("ran")

    kept = TornDownAtFinalization()
    threading.Thread(target=upload).start()
    pool = ThreadPoolExecutor(1)  # its worker is a non-daemon thread that ends only when threading's hooks run
    pool.submit(lambda: None).result()
    atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
    atexit.register(lambda: 1 / 0)  # a handler that fails (run first): the others still run, the code stands
    print("last words", end="")
    leave(3)
""")


def test_leave_runs_what_the_script_needs_and_skips_teardown(tmp_path):
    out = tmp_path / "marks"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "last words"
    assert (tmp_path / "marks.thread").read_text() == "done"
    assert (tmp_path / "marks.atexit").read_text() == "ran"
    assert not (tmp_path / "marks.teardown").exists()
