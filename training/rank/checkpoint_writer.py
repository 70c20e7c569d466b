"""Rank 0's asynchronous checkpoint writer: the training thread takes a snapshot, a background thread checks,
serialises and uploads it while training goes on (after torch.distributed.checkpoint.async_save and Orbax's
AsyncCheckpointer: stage to host memory, then write off the critical path).

- At most one checkpoint is in flight. One that falls due while the previous one is still being written
  waits for it, on the training thread, as a wait for the store (health/progress.py `waiting`: a slow store
  that moves bytes is waited for, one that moves nothing gets STORE_UNAVAILABLE); the wait is recorded in the
  `checkpoint` health record and in the run's result (`checkpoint_blocked_seconds`).
- The snapshot (`snapshot`: TrainingState.host_copy) shares no tensor with the live model or optimizer, so
  training can change them while the writer works. It is the one part of a checkpoint on the training
  thread, so it is copied into the previous snapshot's memory once that one is written (one in flight: the
  next snapshot is only taken after it), not into new memory, which the kernel hands out page by page at
  first touch: rank 0 keeps one snapshot's worth of host memory between checkpoints for it, as
  torch.distributed.checkpoint's async_save keeps its staging copy. The writer checks the snapshot holds no
  NaN/Inf first: a non-finite state is never written, whether the health checks run or not, and the
  training thread stops with NONFINITE.
- The writer's thread runs at a lower scheduling priority than training (WRITER_NICENESS): on a host whose
  cores the ranks fill, its serialising and hashing take a core's time when training leaves some, and a
  checkpoint interval is long enough for that. On the link, likewise: while the training thread waits for the
  data of its next step, the upload holds back between chunks (DATA_FIRST_HOLD_SECONDS at a time).
- The files are uploaded first and MANIFEST.json last (checkpoint.py), so a crash or a kill during a write
  leaves the previous checkpoint the newest valid one; then the checkpoint is published (`publish`: the run
  folder's pointer, run_folder.py), and what that drops from keep_last is deleted.
- The final checkpoint is waited for before the run's result is written.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from ..formats.checkpoint import CheckpointStore, checkpoint_name
from ..health.progress import Progress
from ..health.store_ops import StoreOp
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the writer is torch-free: a script's state (script_state.py) is written by it in the TF venv
    from .training_state import TrainingState


# The longest a chunk of an upload holds back while the training thread waits for its data
# (Progress.yield_to_data): the step's data comes first on a link both share (a window of a user's size took
# twice as long beside an upload in flight, bench/results/elastic_recovery_real_size.md), and a part's request
# never idles long enough for the server to drop it (S3 drops a request idle for 20 s).
DATA_FIRST_HOLD_SECONDS = 5.0
# How much nicer than the training thread the writer's thread runs (Linux: the thread alone; 19 at most).
# Not the lowest: on a host crowded with other work a thread at 19 gets almost no CPU, and a write that
# outlasts the checkpoint interval makes the next checkpoint wait on the training thread.
WRITER_NICENESS = 10


def lower_this_threads_priority(by: int = WRITER_NICENESS) -> None:
    """Make the calling thread `by` nicer than it is (Linux applies setpriority to a thread id alone).
    Elsewhere, or where it is not allowed, the thread keeps its priority: a checkpoint is written either way."""
    if not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + by))
    except OSError:
        pass


class NonFiniteState(ValueError):
    """The state due to be checkpointed holds NaN/Inf: it was not written."""

    def __init__(self, step: int, tensors: list[str]):
        self.step, self.tensors = step, tensors
        shown = ", ".join(tensors[:5]) + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")
        super().__init__(f"the training state at step {step} holds NaN/Inf in {shown}; it was not checkpointed")


@dataclasses.dataclass(frozen=True)
class WrittenCheckpoint:
    """What one checkpoint cost: on the training thread (waiting for the previous one, taking the
    snapshot) and on the writer's (serialising, checking, uploading)."""

    name: str
    step: int
    final: bool
    waited_seconds: float
    snapshot_seconds: float
    write_seconds: float
    bytes: int


class AsyncCheckpointWriter:
    def __init__(self, checkpoints: CheckpointStore, progress: Progress,
                 on_written: Callable[[WrittenCheckpoint], None] = lambda written: None,
                 publish: Callable[[str], None] = lambda name: None,
                 on_bytes: Callable[[int], None] = lambda step: None):
        """on_written: called from the writer's thread once a checkpoint is complete and published.
        publish: makes a complete checkpoint the run folder's newest (run_folder.py), from the writer's thread.
        on_bytes: called from the writer's thread with the step whenever bytes of its checkpoint were written
        (fault injection's crash_in_upload)."""
        self._checkpoints, self._progress, self._on_written = checkpoints, progress, on_written
        self._publish, self._on_bytes = publish, on_bytes
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringflow-checkpoint",
                                                           initializer=lower_this_threads_priority)
        # The last snapshot, once written: the next one is copied into its memory (snapshot()).
        self._spare: TrainingState | None = None
        self._op: StoreOp | None = None  # the last write's, kept after it ends (its time goes in a verdict)
        self._future: concurrent.futures.Future | None = None
        self.blocked_seconds = 0.0  # the training thread's time in checkpoints: waits and snapshots

    def submit(self, step: int, take_state: Callable[[], TrainingState], meta: dict[str, Any],
               final: bool = False, waited_before: float = 0.0) -> str:
        """Snapshot the state now and write it in the background; the checkpoint's name. Raises what the
        previous write raised (a store that failed, a non-finite state). waited_before: the caller's own wait
        for the previous write (every rank's, callbacks/checkpointing.py), counted as this one's wait."""
        started = time.perf_counter()
        self.wait()
        waited = waited_before + time.perf_counter() - started
        started = time.perf_counter()
        state = take_state()
        snapshot = time.perf_counter() - started
        self.blocked_seconds += waited + snapshot
        name = checkpoint_name(step)
        self._op = StoreOp(f"upload of checkpoint {name}", self._checkpoints.store.uri)
        self._future = self._pool.submit(self._write, self._op, step, state, meta, final, waited, snapshot)
        return name

    def hand_to(self, on_written: Callable[[WrittenCheckpoint], None], publish: Callable[[str], None],
                on_bytes: Callable[[int], None]) -> None:
        """The next round of an elastic job, on the process that stays the writer, takes this writer over: a
        write still in flight goes on, and is published and recorded through the new round's callbacks (the
        same run folder and health log), so the old round's trainer is not kept alive by it."""
        self._on_written, self._publish, self._on_bytes = on_written, publish, on_bytes

    def snapshot(self, state: TrainingState, pin_memory: bool = False) -> TrainingState:
        """A host copy of `state` for submit() to write (call it in submit's take_state), in the memory of the
        last snapshot written where there is one."""
        spare, self._spare = self._spare, None
        return state.host_copy(pin_memory, into=spare)

    def wait_for(self, seconds: float) -> bool:
        """Wait at most `seconds` for the write in flight (as a wait for the store); whether none is left."""
        future, op = self._future, self._op
        if future is None or future.done():
            return True
        with self._progress.waiting(op):
            concurrent.futures.wait([future], timeout=seconds)
        return future.done()

    def wait(self) -> None:
        """Return once nothing is in flight; raise what the last write raised."""
        future, op = self._future, self._op
        if future is None:
            return
        if not future.done():
            with self._progress.waiting(op):
                concurrent.futures.wait([future])
        self._future = None
        future.result()

    def failed(self) -> BaseException | None:
        """What the last write raised, once it has finished (None while it runs or when it succeeded)."""
        future = self._future
        if future is None or not future.done():
            return None
        return future.exception()

    @property
    def store_uri(self) -> str:
        return self._checkpoints.store.uri

    @property
    def last_write_seconds(self) -> float:
        return self._op.seconds if self._op is not None else 0.0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _write(self, op: StoreOp, step: int, state: TrainingState, meta: dict[str, Any], final: bool,
               waited: float, snapshot: float) -> WrittenCheckpoint:
        started = time.perf_counter()
        try:
            bad = state.nonfinite_tensors()
            if bad:
                raise NonFiniteState(step, bad)
            with tempfile.TemporaryDirectory(prefix="ringflow-checkpoint-") as folder:
                path = os.path.join(folder, state.file_name)
                state.save(path)
                size = os.path.getsize(path)
                op.total_bytes = size
                def moved(nbytes: int) -> None:
                    op.moved(nbytes)
                    self._on_bytes(step)
                    self._progress.yield_to_data(DATA_FIRST_HOLD_SECONDS)

                name = self._checkpoints.save_files(step, {state.file_name: path}, meta, progress=moved)
            self._publish(name)
        except BaseException as exc:
            op.finish(exc)
            raise
        op.finish()
        self._spare = state  # written: the next snapshot may overwrite it
        written = WrittenCheckpoint(name, step, final, waited, snapshot, time.perf_counter() - started, size)
        self._on_written(written)
        return written
