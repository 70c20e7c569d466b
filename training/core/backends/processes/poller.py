"""A launcher-side watch's thread: `look` every few seconds while the job runs."""
from __future__ import annotations

import sys
import threading
from typing import Callable


class Poller:
    """While in this context, `look()` every `seconds` on a thread named `name`, until it returns True (found
    what it looks for); `look_on_exit`: once more on the way out, after the thread has ended."""

    def __init__(self, look: Callable[[], bool], seconds: float, name: str, look_on_exit: bool = False):
        self._look, self._seconds, self._look_on_exit = look, seconds, look_on_exit
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        failures = 0
        while not self._stopped.wait(self._seconds):
            try:
                if self._look():
                    return
            except Exception as exc:  # noqa: BLE001 - a failed look (a process gone mid-read) is not the job's end
                failures += 1
                if failures in (1, 10, 100):
                    print(f"[ringflow] {self._thread.name}: a look failed ({failures}x): {exc!r}", file=sys.stderr,
                          flush=True)

    def __enter__(self) -> "Poller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join()
        if self._look_on_exit:
            self._look()
