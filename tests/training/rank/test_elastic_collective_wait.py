"""Which elastic rank is the one that hangs (rank/elastic.py in_a_collective): a training thread blocked in Horovod's
wait for a collective waits on a peer; one blocked anywhere else is the hung one."""
import os
import threading

from ringflow.training.rank.elastic import in_a_collective

# A function named as Horovod's wait, compiled as if from Horovod's file: the check reads code objects only.
HOROVOD_WAIT = compile("def synchronize(handle):\n    handle.wait()\n",
                       os.path.join("site-packages", "horovod", "torch", "mpi_ops.py"), "exec")


def blocked_thread(in_horovod: bool):
    """A thread blocked on an event, inside Horovod's wait or in code of its own; (thread, its release)."""
    release, ready = threading.Event(), threading.Event()
    scope: dict = {}
    exec(HOROVOD_WAIT, scope)

    class Handle:
        def wait(self):
            ready.set()
            release.wait(10)

    target = (lambda: scope["synchronize"](Handle())) if in_horovod else Handle().wait
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert ready.wait(5)
    return thread, release


def test_a_thread_in_horovods_wait_is_waiting_on_peers_and_one_elsewhere_is_not():
    for in_horovod in (True, False):
        thread, release = blocked_thread(in_horovod)
        try:
            assert in_a_collective(thread.ident)() is in_horovod
        finally:
            release.set()
            thread.join(5)
    assert in_a_collective(-1)() is False  # a thread that is gone
