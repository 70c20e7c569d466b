"""Progress: what the watchdog and the heartbeat read of the training thread. Its waits for the store are
kept per thread, so waits on two threads never restore each other's (a finished operation left as the
wait looked idle, then STORE_UNAVAILABLE after store_timeout_seconds, in a healthy run)."""
import threading

from ringflow.training.health.progress import Progress
from ringflow.training.health.store_ops import StoreOp


def op(name):
    return StoreOp(name, "s3://b/run")


def test_nested_waits_on_one_thread_restore_the_outer_one():
    progress = Progress(step=3)
    with progress.waiting(op("upload")):
        with progress.waiting(op("read")):
            assert progress.read().waiting.what == "read"
        assert progress.read().waiting.what == "upload"
    assert progress.read().waiting is None


def test_waits_interleaved_on_two_threads_leave_none_behind():
    """The training thread waits for a checkpoint upload while the loader thread opens a file; the open
    began first and ends first (each thread's exit used to put back the other's wait)."""
    progress = Progress(step=3)
    opened, upload_entered, open_done = threading.Event(), threading.Event(), threading.Event()

    def loader():
        with progress.waiting(op("open")):
            opened.set()
            upload_entered.wait(5)
        open_done.set()

    thread = threading.Thread(target=loader)
    thread.start()
    opened.wait(5)
    with progress.waiting(op("upload")):
        upload_entered.set()
        open_done.wait(5)
        assert progress.read().waiting.what == "upload"  # the open is over; this thread still waits
    thread.join(5)
    assert progress.read().waiting is None
