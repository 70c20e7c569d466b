"""The training thread's last sign of progress, and what it is waiting for.

The stall watchdog (every rank) and the heartbeat writer (rank 0) read one `Progress` from their threads, so
both judge the same quantities (liveness.py decides):

- `step`: the last completed step (None before the first), and `silent_seconds`, how long the training
  thread has made no progress: since the last step, or, before the first step, since the start-up phase
  last moved (`phase`, `advance`, the end of a wait for the store);
- `phase`: where start-up stands (rendezvous, fetch, verify, restore, first step; "training" after the
  first step), with what it has done (`done`: bytes, row groups), so a start-up that keeps moving is never
  stalled however long it takes;
- `waiting`: the store operation the training thread is blocked on (store_ops.py), if any. Time spent
  waiting for the store is not silence: the store has a rule of its own, and when the wait ends the
  silence starts from zero;
- `waiting_on_peers`: an elastic rank's training thread is blocked in a collective (rank/elastic.py sets the
  check, `peers_check`): its silence is judged with a longer limit (liveness.PEER_WAIT_STALLS), in the job and
  from the heartbeat alike.

It also carries one rule between the rank's threads, data first: while the training thread waits for the data
its next step needs (`awaiting_data`), or that data loads before it waits (`data_first_until`: a trainer's
first window), a background write (rank 0's checkpoint upload) holds back between its chunks
(`yield_to_data`), so on a link both share the step's data is not slowed by a write nothing waits for.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from typing import Callable, Iterator

from .store_ops import StoreOp, StoreOpReading

RENDEZVOUS, FETCH, VERIFY, RESTORE, FIRST_STEP, TRAINING = (
    "rendezvous", "fetch", "verify", "restore", "first step", "training")


@dataclasses.dataclass(frozen=True)
class ProgressReading:
    step: int | None
    phase: str
    silent_seconds: float
    progress_at: float               # wall-clock time of the last progress (for the heartbeat)
    done: dict[str, int]             # what the current start-up phase has done, e.g. {"bytes": 123}
    waiting: StoreOpReading | None   # the store operation the training thread waits for
    waiting_on_peers: bool = False   # blocked in a collective (an elastic rank's peers_check)


class Progress:
    def __init__(self, step: int | None = None, phase: str = RENDEZVOUS):
        self._lock = threading.Lock()
        self._step, self._phase, self._done = step, phase if step is None else TRAINING, {}
        self._mono, self._wall = time.monotonic(), time.time()
        # Each thread's innermost wait (the training thread's, in practice), so that waits entered on two
        # threads never restore each other's: a finished operation left as the wait would look idle and,
        # after store_timeout_seconds, be judged STORE_UNAVAILABLE in a healthy run.
        self._waiting: dict[int, tuple[int, StoreOp]] = {}  # thread -> (when entered, in entry order; op)
        self._entered = 0
        # Whether the training thread is blocked in a collective now (set once, before anything reads; None:
        # never asked, a rank whose peers' silence is no different from its own).
        self.peers_check: Callable[[], bool] | None = None
        # Set unless data the training thread needs next is awaited (awaiting_data, data_first_until): what
        # yield_to_data waits for; how many such waits are open.
        self._data_not_awaited = threading.Event()
        self._data_not_awaited.set()
        self._data_awaited = 0

    def _moved(self) -> None:
        self._mono, self._wall = time.monotonic(), time.time()

    def beat(self, step: int | None) -> None:
        """A step completed (or, with None, training is ready to start)."""
        with self._lock:
            self._step = step
            if step is not None:
                self._phase, self._done = TRAINING, {}
            self._moved()

    def phase(self, name: str) -> None:
        """Start-up moved on to phase `name`."""
        with self._lock:
            self._phase, self._done = name, {}
            self._moved()

    def advance(self, **done: int) -> None:
        """The current start-up phase did more (e.g. bytes=4096): progress."""
        with self._lock:
            for unit, amount in done.items():
                self._done[unit] = self._done.get(unit, 0) + amount
            self._moved()

    def alive(self) -> None:
        """A sign of life that is neither a step nor start-up: a round of the checkpoint wait went through
        (callbacks/checkpointing.py), so every rank answered and rank 0's upload goes on."""
        with self._lock:
            self._moved()

    @contextlib.contextmanager
    def waiting(self, op: StoreOp) -> Iterator[StoreOp]:
        """The training thread blocks on `op` inside this block: not silence, the store's time."""
        thread = threading.get_ident()
        with self._lock:
            outer = self._waiting.get(thread)
            self._entered += 1
            self._waiting[thread] = (self._entered, op)
        try:
            yield op
        finally:
            with self._lock:
                if outer is not None:
                    self._waiting[thread] = outer
                else:
                    del self._waiting[thread]
                if self._step is None:  # start-up: what the phase has read or written so far
                    self._done["bytes"] = self._done.get("bytes", 0) + op.reading().bytes
                self._moved()

    def _await_data(self, delta: int) -> None:
        with self._lock:
            self._data_awaited += delta
            if self._data_awaited:
                self._data_not_awaited.clear()
            else:
                self._data_not_awaited.set()

    @contextlib.contextmanager
    def awaiting_data(self, op: StoreOp) -> Iterator[StoreOp]:
        """waiting(op) for the data the training thread's next step needs: the wait background writes give
        way to (yield_to_data)."""
        self._await_data(1)
        try:
            with self.waiting(op):
                yield op
        finally:
            self._await_data(-1)

    def data_first_until(self, load: "concurrent.futures.Future") -> None:
        """Background writes give way from now until `load` is done: the load of the data the training thread
        will need first, started before it waits (a trainer's first window, loading while the loop is set up)."""
        self._await_data(1)
        load.add_done_callback(lambda _: self._await_data(-1))

    def yield_to_data(self, limit: float) -> None:
        """From a background write's thread, between two of its chunks: hold while data the training thread
        needs next is awaited (awaiting_data, data_first_until), at most `limit` seconds."""
        self._data_not_awaited.wait(limit)

    def read(self) -> ProgressReading:
        with self._lock:
            now = time.monotonic()
            _, op = max(self._waiting.values(), key=lambda entry: entry[0], default=(0, None))  # entered last
            waiting = op.reading(now) if op is not None else None
            done = dict(self._done)
            if waiting is not None and self._step is None:
                done["bytes"] = done.get("bytes", 0) + waiting.bytes
            check = self.peers_check
            return ProgressReading(self._step, self._phase, now - self._mono, self._wall, done, waiting,
                                   check is not None and check())
