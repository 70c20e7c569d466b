"""Store operations in flight in this process, and the bytes each has moved.

Whatever moves bytes to or from a store off the training thread (the checkpoint writer, the partition
loader, the health log's flusher) opens a `StoreOp` and reports its bytes through `moved`, which the stores
call from their transfer threads (store/base.py `Progress`). When the training thread has to wait for one
of them (the first window of data, a checkpoint due while the last one is still uploading), it waits
through `Progress.waiting(op)` (progress.py), and the liveness rule (liveness.py) judges the store by the
op, not the training thread by its silence: a slow store that still moves bytes is waited for, a store
that moves nothing for `health.store_timeout_seconds` gets a verdict of its own (STORE_UNAVAILABLE).
"""
from __future__ import annotations

import dataclasses
import threading
import time


class StoreOp:
    """One store operation: what it is (`what`, e.g. "upload of checkpoints/ckpt-000000050/state.pt"), the
    store's URI, when it started, when it last moved a byte, and how many it has moved. Thread-safe: bytes
    arrive from transfer threads while the watchdog reads."""

    def __init__(self, what: str, store_uri: str, total_bytes: int | None = None):
        self.what, self.store_uri, self.total_bytes = what, store_uri, total_bytes
        self.started = self._last_moved = time.monotonic()
        self.ended: float | None = None
        self._bytes = 0
        self._bytes_lock = threading.Lock()  # several transfer threads may report at once
        self._done = threading.Event()
        self.error: BaseException | None = None

    def moved(self, nbytes: int) -> None:
        # A reader may see the bytes a moment before the time, never a torn value.
        with self._bytes_lock:
            self._bytes += nbytes
        self._last_moved = time.monotonic()

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.ended = self._last_moved = time.monotonic()
        self._done.set()

    @property
    def seconds(self) -> float:
        """How long it ran (so far, while it runs)."""
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def reading(self, now: float | None = None) -> "StoreOpReading":
        now = time.monotonic() if now is None else now
        return StoreOpReading(self.what, self.store_uri, now - self.started, now - self._last_moved, self._bytes,
                              self.total_bytes)


@dataclasses.dataclass(frozen=True)
class StoreOpReading:
    """A store operation as seen at one moment: plain data for the liveness rule, the heartbeat and a verdict."""

    what: str
    store_uri: str
    seconds: float       # since it started
    idle_seconds: float  # since it last moved a byte (or started)
    bytes: int
    total_bytes: int | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> "StoreOpReading":
        return cls(**{f.name: doc[f.name] for f in dataclasses.fields(cls) if f.name in doc})

    def describe(self) -> str:
        of = f" of {self.total_bytes / 2**20:.1f} MiB" if self.total_bytes else ""
        return (f"{self.what} on {self.store_uri}: {self.bytes / 2**20:.1f} MiB{of} moved in {self.seconds:.0f}s, "
                f"nothing for the last {self.idle_seconds:.0f}s")
