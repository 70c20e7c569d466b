"""A rank's view of its partition, streamed: one shuffle window of Parquet row groups in memory (and the next
one loading), a deterministic order per epoch, and a cursor that resumes at any minibatch.

The order of epoch `e` on rank `r` depends on (seed, e, r) alone, never on a running RNG, so a restart
reproduces it: the partition's row groups are permuted, taken `SHUFFLE_WINDOW` at a time, and the rows of each
window are permuted among themselves (a shuffle buffer of that many row groups). The shard step already put
the rows in a random order, so every row group is a uniform sample of the data and the window only has to
vary the order from epoch to epoch. Because every window's size is known from the Parquet footer, minibatch
`b` is found without reading what comes before it: resume reads one window and starts inside it.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch

from ..formats.datasets import tensor_matrix
from .devices import Placement, to_device
from ..health.progress import VERIFY, Progress
from ..health.store_ops import StoreOp
from ..formats.manifest import ShardManifest, ShardSchema
from .partition_stream import PartitionSource, open_partition
from ..store.base import ObjectStore

# Row groups shuffled together: with the shard step's ~4 MiB row groups, a 16 MiB shuffle buffer.
SHUFFLE_WINDOW = 4


@dataclasses.dataclass(frozen=True)
class Cursor:
    """Where training stands: the next minibatch to take is `batch` of `epoch`.

    Saved in every checkpoint; a resumed run continues at exactly this minibatch, so no sample is seen
    twice or skipped within an epoch.
    """

    epoch: int = 0
    batch: int = 0


@dataclasses.dataclass(frozen=True)
class Window:
    """Row groups read together and the permutation of their rows; `start` is its first row in the epoch."""

    groups: tuple[int, ...]
    start: int
    order: np.ndarray = dataclasses.field(compare=False, repr=False)

    @property
    def rows(self) -> int:
        return len(self.order)


def epoch_windows(group_rows: Sequence[int], seed: int, epoch: int, rank: int,
                  window: int = SHUFFLE_WINDOW) -> list[Window]:
    """The order of one epoch: row groups permuted, `window` at a time, rows permuted within each window.
    Pure: depends on the row-group sizes and (seed, epoch, rank) alone."""
    if window < 1:
        raise ValueError(f"shuffle window is {window}; use >= 1 row group")
    rng = np.random.default_rng([seed, epoch, rank])
    groups = rng.permutation(len(group_rows))
    out, start = [], 0
    for i in range(0, len(groups), window):
        chosen = tuple(int(g) for g in groups[i:i + window])
        rows = sum(group_rows[g] for g in chosen)
        out.append(Window(chosen, start, np.random.default_rng([seed, epoch, rank, i]).permutation(rows)))
        start += rows
    return out


def epoch_order(group_rows: Sequence[int] | int, seed: int, epoch: int, rank: int,
                window: int = SHUFFLE_WINDOW) -> np.ndarray:
    """Every row of the partition (numbered in file order) in the order epoch `epoch` serves them: for tests
    and tools; training never materializes it. An int is one row group of that many rows."""
    sizes = [group_rows] if isinstance(group_rows, int) else list(group_rows)
    first_row = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    parts = []
    for w in epoch_windows(sizes, seed, epoch, rank, window):
        rows = np.concatenate([np.arange(first_row[g], first_row[g] + sizes[g]) for g in w.groups])
        parts.append(rows[w.order])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def to_tensors(table: "pa.Table | pa.RecordBatch", schema: ShardSchema) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of a table of stored rows: x has shape (rows, *schema.input_shape), normalized with the
    manifest's mean/std; y is int64 class indices or float32 values."""
    if not isinstance(table, (pa.Table, pa.RecordBatch)):  # a DataFrame (older callers)
        table = pa.Table.from_pandas(table, preserve_index=False)
    parts = []
    for i, spec in enumerate(schema.feature_columns):
        values, _ = tensor_matrix(table.column(spec.name), np.float32)
        if schema.feature_mean:
            values = (values - np.float32(schema.feature_mean[i])) / np.float32(schema.feature_std[i])
        parts.append(values)
    x = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), *schema.input_shape)
    y = table.column(schema.target).to_numpy()
    y_t = torch.from_numpy(y.astype(np.int64)) if schema.task == "classification" else torch.from_numpy(y.astype(np.float32))
    return torch.from_numpy(x), y_t


class PartitionData:
    """One rank's partition, streamed. `batches(seed, cursor)` yields (batch_index, x, y) for the cursor's
    epoch from its minibatch on, reading one window of row groups at a time while the next one loads.

    The partition comes from `store` (partition_stream.open_partition: ranged reads of a v3 manifest's row
    groups, each checked as it arrives; an older manifest's file whole, checked first). Opening it and each
    window's read are store operations (health/store_ops.py); when the training thread has to wait for one,
    it waits through `progress` (the store is judged, not the thread).

    placement: where the batches go (devices.py). On a GPU a window is put in pinned host memory by the
    loader thread, and each batch is copied from it without blocking, so the copy overlaps the compute."""

    def __init__(self, store: ObjectStore, manifest: ShardManifest, rank: int, world_size: int, batch_size: int,
                 window: int = SHUFFLE_WINDOW, placement: Placement | None = None,
                 progress: Progress | None = None):
        self.progress = progress or Progress()
        entry = manifest.partition_for_rank(rank, world_size)
        opening = StoreOp(f"read of {entry.key}'s index" if entry.indexed else f"download of {entry.key}",
                          store.uri, None if entry.indexed else entry.size or None)
        with self.progress.waiting(opening):
            self.source: PartitionSource = open_partition(store, entry, opening.moved,
                                                          on_verify=lambda: self.progress.phase(VERIFY))
        opening.finish()
        self.schema = manifest.schema
        self.group_rows = list(self.source.group_rows)
        self.rows = sum(self.group_rows)
        self.rank = rank
        self.batch_size = batch_size
        self.window = window
        self.batches_per_epoch = self.rows // batch_size
        self.placement = placement
        self._columns = [*manifest.schema.features, manifest.schema.target]
        # A partition of one window is decoded once and kept (on its first load): streaming holds that much
        # in memory anyway, and decoding it again each epoch took ~9 % of a small model's training time, on
        # the critical path at every epoch start (bench/results/throughput.md). Larger ones stream.
        self._keep_decoded = len(self.group_rows) <= window
        self._decoded: tuple[torch.Tensor, torch.Tensor] | None = None
        self._group_start = np.concatenate([[0], np.cumsum(self.group_rows)[:-1]]).astype(np.int64)
        # One loader thread: Parquet decoding releases the GIL, so the next window loads while this one trains.
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringflow-prefetch")
        self._ahead: tuple[tuple[int, int], "_Pending"] | None = None  # (seed, epoch), its first window

    def __len__(self) -> int:
        return self.rows

    def _submit(self, w: Window) -> "_Pending":
        groups = range(len(self.group_rows)) if self._keep_decoded and self._decoded is None else w.groups
        op = StoreOp(f"read of {self.source.key} row groups {sorted(groups)}", self.source.store_uri,
                     self.source.group_bytes(list(groups)))
        return _Pending(op, self._loader.submit(self._load, w, op))

    def _wait(self, pending: "_Pending") -> tuple[torch.Tensor, torch.Tensor]:
        """The window's tensors; a wait for them is a wait for the store."""
        if not pending.future.done():
            with self.progress.waiting(pending.op):
                return pending.future.result()
        return pending.future.result()

    def _load(self, w: Window, op: StoreOp) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            if not self._keep_decoded:
                x, y = to_tensors(self.source.read(w.groups, self._columns, op.moved), self.schema)
                index = torch.from_numpy(w.order)
            else:  # the window's rows, permuted, picked straight from the decoded partition
                if self._decoded is None:  # rows in file order
                    self._decoded = to_tensors(self.source.read_all(self._columns, op.moved), self.schema)
                x, y = self._decoded
                rows = np.concatenate([np.arange(self._group_start[g], self._group_start[g] + self.group_rows[g])
                                       for g in w.groups])
                index = torch.from_numpy(rows[w.order])
            x, y = x[index], y[index]
            if self.placement is not None and self.placement.pin_memory:
                x, y = x.pin_memory(), y.pin_memory()
        except BaseException as exc:
            op.finish(exc)
            raise
        op.finish()
        return x, y

    def _load_ahead(self, seed: int, epoch: int) -> None:
        """Start loading `epoch`'s first window for the batches() call that comes next, so no epoch starts
        by waiting for its data (a partition of one window waited at every epoch). After the last epoch
        this loads one window that nobody takes."""
        first = epoch_windows(self.group_rows, seed, epoch, self.rank, self.window)[0]
        self._ahead = ((seed, epoch), self._submit(first))
    def _cat(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # Into pinned memory when the window was: the rest of the window is served from it.
        pin = self.placement is not None and self.placement.pin_memory
        out = torch.empty((len(a) + len(b), *a.shape[1:]), dtype=a.dtype, pin_memory=pin)
        return torch.cat([a, b], out=out)

    def _out(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.placement is None:
            return x, y
        return to_device(x, self.placement), to_device(y, self.placement)

    def batches(self, seed: int, cursor: Cursor) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """Yield (batch_index, x, y) for cursor.epoch from cursor.batch on."""
        windows = epoch_windows(self.group_rows, seed, cursor.epoch, self.rank, self.window)
        first_row = cursor.batch * self.batch_size
        todo = [w for w in windows if w.start + w.rows > first_row]
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == (seed, cursor.epoch) and todo and todo[0].start == 0:
            pending = ahead[1]  # loaded while the previous epoch's last window trained
        else:
            pending = self._submit(todo[0]) if todo else None
        carry_x, carry_y, position = None, None, first_row
        b = cursor.batch
        for i, w in enumerate(todo):
            x, y = self._wait(pending)
            if i + 1 < len(todo):
                pending = self._submit(todo[i + 1])
            else:  # the last window of this epoch: start loading the next epoch's first one
                self._load_ahead(seed, cursor.epoch + 1)
                pending = None
            skip = max(0, position - w.start)
            x, y = x[skip:], y[skip:]
            if carry_x is not None:  # a minibatch that spans two windows
                x, y = self._cat(carry_x, x), self._cat(carry_y, y)
            whole = len(x) // self.batch_size
            for k in range(whole):
                if b >= self.batches_per_epoch:
                    return
                yield b, *self._out(x[k * self.batch_size:(k + 1) * self.batch_size],
                                    y[k * self.batch_size:(k + 1) * self.batch_size])
                b += 1
            rest = whole * self.batch_size
            carry_x, carry_y = (x[rest:], y[rest:]) if rest < len(x) else (None, None)
            position = w.start + w.rows


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A window being loaded: its store operation and the loader's future."""

    op: StoreOp
    future: concurrent.futures.Future
