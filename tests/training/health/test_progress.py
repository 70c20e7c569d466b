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


def test_a_background_write_yields_only_while_the_training_thread_awaits_its_data():
    """yield_to_data returns at once unless the training thread is in awaiting_data (which is also a wait for
    the store), and then at the wait's end or after its limit."""
    import time

    progress = Progress(step=3)
    started = time.monotonic()
    progress.yield_to_data(5)
    assert time.monotonic() - started < 1
    with progress.awaiting_data(op("read of a window")):
        assert progress.read().waiting.what == "read of a window"
        started = time.monotonic()
        progress.yield_to_data(0.2)  # the limit
        assert time.monotonic() - started >= 0.2
    ended = []
    with progress.awaiting_data(op("read of a window")):
        waiter = threading.Thread(target=lambda: (progress.yield_to_data(30), ended.append(time.monotonic())))
        waiter.start()
        time.sleep(0.3)
        assert not ended
        left = time.monotonic()
    waiter.join(5)
    assert ended and ended[0] >= left and progress.read().waiting is None


def test_a_background_write_yields_until_the_first_data_has_loaded():
    """data_first_until: from the start of a load the training thread will wait for, until it is done (a
    trainer's first window, loading while the loop is set up), nested with awaiting_data."""
    import concurrent.futures
    import time

    progress = Progress(step=3)
    load = concurrent.futures.Future()
    progress.data_first_until(load)
    started = time.monotonic()
    progress.yield_to_data(0.2)
    assert time.monotonic() - started >= 0.2
    with progress.awaiting_data(op("read of a window")):
        load.set_result(None)
        started = time.monotonic()
        progress.yield_to_data(0.2)  # still awaited: the training thread waits
        assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    progress.yield_to_data(5)
    assert time.monotonic() - started < 1
