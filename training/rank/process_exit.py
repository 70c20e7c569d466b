"""How a rank that ran the user's own script ends: as Python would, less the interpreter's finalization.

A script's libraries leave native threads behind that Python does not own: Gloo's worker threads (torch's
process group, a DDP reducer) may still hold tensors, and when the interpreter is torn down under them the
process aborts (`terminate called without an active exception`, SIGABRT) after the script had finished and
the rank had written its result: seen here once after a script's own `dist.destroy_process_group()`, and
pytorch/pytorch#179291 describes the mechanism. The launcher then counts a failed worker, and the try is lost.
So the rank does what finalization would do for the script and its result (its non-daemon threads joined, its
atexit handlers run, stdout and stderr flushed), then `os._exit`, skipping the teardown of modules and native
objects.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """Ends the process with `code` after finish(). A rank forked from torchrun (rank/forked_rank.py) has no
    interpreter teardown to skip and torchrun waits for its return, so there `code` goes back to forked_rank
    (SystemExit), which finishes the same way."""
    if multiprocessing.parent_process() is not None:
        raise SystemExit(code)
    finish()
    os._exit(code)


def finish() -> None:
    """What the interpreter does first when it ends, from the main thread: threading's exit hooks (a thread
    pool's workers told to end), then every non-daemon thread joined (a script's upload thread finishes), then
    the atexit handlers (a tracker's flush, logging's shutdown), then stdout and stderr flushed. Whatever one
    step raises (a Ctrl-C while threads are joined), the next runs."""
    for step in (threading._shutdown, atexit._run_exitfuncs):  # type: ignore[attr-defined]
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - the exit goes on
            _tell(f"[ringflow] while ending: {type(exc).__name__}: {exc}")
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass


def _tell(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass
