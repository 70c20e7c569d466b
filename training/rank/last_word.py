"""A rank stopped with SIGTERM writes what it has not yet written before it goes.

torchrun stops every worker with SIGTERM (then SIGKILL after 30 s) when one of an elastic DDP job's workers dies,
and starts them all again (ddp_elastic.py): without a handler, rank 0 ends at once and the health records it
had not yet written (up to health.flush_seconds of them) are lost from the run's history. A Python signal
handler would not do: it runs on the main thread, between bytecodes, and the training thread is the main thread,
blocked in a collective while its peer is gone. So SIGTERM only writes a byte to a pipe (signal.set_wakeup_fd)
and a thread of its own, waiting on that pipe, writes the records (at most `seconds`) and ends the process with
SIGTERM's status (143). A child forked from the rank gets SIGTERM's default back (its parent's pipe and thread
are not its own).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

from .rank_start import within

# How long a stopped rank tries to write its records: torchrun waits 30 s before SIGKILL, and a restart waits
# for the rank to go, so a store that hangs costs the restart this long at most.
SIGTERM_WORD_SECONDS = 5.0
# Held by whatever writes a rank's last records and its result (RankRun.write_result; an elastic DDP rank's
# failure path and SIGTERM's thread, ddp_elastic.py): one at a time, so SIGTERM's thread, which ends the process
# when it is done, never ends it while another is still writing (a rank stopping on a verdict when torchrun's
# SIGTERM comes, its peer having ended first).
ENDING = threading.Lock()


def on_sigterm(last_word: Callable[[], None], say: Callable[[str], None],
               seconds: float = SIGTERM_WORD_SECONDS) -> None:
    """From now on, SIGTERM runs `last_word` (at most `seconds`) and then ends the process (128 + SIGTERM).
    Call from the main thread, before training."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: None)  # the C handler's byte is what counts
    # SIGTERM is held back in the forking thread across the fork, so a child signalled before its hook ran
    # still ends on its own default, not through the parent's pipe.
    os.register_at_fork(before=_hold_sigterm, after_in_parent=_release_sigterm, after_in_child=_default_sigterm)

    def wait() -> None:
        while True:
            got = os.read(read_end, 64)
            if not got:  # the pipe was closed: nothing will come
                return
            if signal.SIGTERM in got:
                break
        say("SIGTERM: writing the health records not yet written, then ending")
        within(seconds, last_word)
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="ringflow-sigterm", daemon=True).start()


def _hold_sigterm() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _release_sigterm() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _default_sigterm() -> None:
    """In a forked child: its SIGTERM its own again (the default: end), not a byte in the parent's pipe."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _release_sigterm()
