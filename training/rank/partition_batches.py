"""A rank's view of its partition, streamed, as numpy arrays: one shuffle window of Parquet row groups in memory
(and the next one loading), a deterministic order per epoch, and a cursor that resumes at any minibatch.
Torch-free: the TensorFlow rank reads its partition with it as it is, and data.py's PartitionData is the same
reader serving torch tensors (through the hooks below), so every engine trains on the same rows in the same
order.

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
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..formats.config import ConfigError, RowRef
from ..formats.datasets import tensor_matrix
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


def to_arrays(table: "pa.Table | pa.RecordBatch", schema: ShardSchema) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a table of stored rows: x float32 of shape (rows, *schema.input_shape), normalized with the
    manifest's mean/std; y int64 class indices or float32 values."""
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
    return x, y.astype(np.int64) if schema.task == "classification" else y.astype(np.float32)


def check_skip_rows(skip_rows: Sequence[RowRef], manifest: ShardManifest, shards_uri: str) -> None:
    """ConfigError unless every row of `skip_rows` is a row of one of the manifest's partitions (every rank
    checks them all: each reader honours only its own partition's, and a row of none would be skipped by none)."""
    rows = {p.key: p.rows for p in manifest.partitions}
    for r in skip_rows:
        if r.file not in rows:
            raise ConfigError("skip_rows", f"names file {r.file!r}, which is not a partition of the shards at "
                                           f"{shards_uri} "
                                           f"(its partitions: {sorted(rows)[:4]}{' ...' if len(rows) > 4 else ''})",
                              "take the rows from a NONFINITE verdict's evidence.replay.rows of these shards")
        if r.row >= rows[r.file]:
            raise ConfigError("skip_rows", f"names row {r.row} of {r.file}, which has {rows[r.file]} rows",
                              "take the rows from a NONFINITE verdict's evidence.replay.rows of these shards")


class PartitionBatches:
    """One rank's partition, streamed. `batches(seed, cursor)` yields (batch_index, x, y) for the cursor's
    epoch from its minibatch on, reading one window of row groups at a time while the next one loads.
    x and y are numpy arrays here; a subclass serves its library's tensors through the hooks `_decode`,
    `_index`, `_pin`, `_cat` and `_out` (data.py's PartitionData).

    The partition comes from `store` (partition_stream.open_partition: ranged reads of a v3 manifest's row
    groups, each checked as it arrives; an older manifest's file whole, checked first). Opening it and each
    window's read are store operations (health/store_ops.py); when the training thread has to wait for one,
    it waits through `progress` (the store is judged, not the thread).

    placement: where a subclass puts the batches (data.py: devices.py's Placement); unused here.
    skip_rows: rows never served (the job config's skip_rows); those of other partitions are ignored here."""

    def __init__(self, store: ObjectStore, manifest: ShardManifest, rank: int, world_size: int, batch_size: int,
                 window: int = SHUFFLE_WINDOW, placement: Any = None,
                 progress: Progress | None = None, skip_rows: Sequence[RowRef] = ()):
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
        self._decoded: tuple[Any, Any] | None = None
        self._group_start = np.concatenate([[0], np.cumsum(self.group_rows)[:-1]]).astype(np.int64)
        check_skip_rows(skip_rows, manifest, store.uri)
        self.skipped = np.array(sorted(r.row for r in skip_rows if r.file == self.source.key), dtype=np.int64)
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

    def _wait(self, pending: "_Pending") -> tuple[Any, Any]:
        """The window's tensors; a wait for them is a wait for the store."""
        if not pending.future.done():
            with self.progress.waiting(pending.op):
                return pending.future.result()
        return pending.future.result()

    def _load(self, w: Window, op: StoreOp) -> tuple[Any, Any]:
        try:
            if not self._keep_decoded:
                x, y = self._decode(self.source.read(w.groups, self._columns, op.moved))
                index = self._index(w.order)
            else:  # the window's rows, permuted, picked straight from the decoded partition
                if self._decoded is None:  # rows in file order
                    self._decoded = self._decode(self.source.read_all(self._columns, op.moved))
                x, y = self._decoded
                rows = np.concatenate([np.arange(self._group_start[g], self._group_start[g] + self.group_rows[g])
                                       for g in w.groups])
                index = self._index(rows[w.order])
            x, y = self._pin(x[index], y[index])
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

    # The hooks a subclass overrides to serve its library's tensors (numpy arrays here).
    def _decode(self, table: "pa.Table") -> tuple[Any, Any]:
        """(x, y) of a table of stored rows, in file order."""
        return to_arrays(table, self.schema)

    def _index(self, rows: np.ndarray) -> Any:
        """Row numbers in the form x[...] takes."""
        return rows

    def _pin(self, x: Any, y: Any) -> tuple[Any, Any]:
        """A loaded window, as the batches will be served from it (the loader thread's last step)."""
        return x, y

    def _cat(self, a: Any, b: Any) -> Any:
        """A minibatch that spans two windows: the first's rest, then the second's start."""
        return np.concatenate([a, b])

    def _out(self, x: Any, y: Any) -> tuple[Any, Any]:
        """One minibatch as the loop takes it."""
        return x, y

    def batches(self, seed: int, cursor: Cursor) -> Iterator[tuple[int, Any, Any]]:
        """Yield (batch_index, x, y) for cursor.epoch from cursor.batch on."""
        windows = epoch_windows(self.group_rows, seed, cursor.epoch, self.rank, self.window)
        first_row = cursor.batch * self.batch_size
        todo = [w for w in windows if w.start + w.rows > first_row]
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == (seed, cursor.epoch) and todo and todo[0].start == 0:
            pending = ahead[1]  # loaded while the previous epoch's last window trained
        else:
            pending = self._submit(todo[0]) if todo else None
        carry_x, carry_y, carry_ids, position = None, None, None, first_row
        b = cursor.batch
        skipping = self.skipped.size > 0
        for i, w in enumerate(todo):
            x, y = self._wait(pending)
            if i + 1 < len(todo):
                pending = self._submit(todo[i + 1])
            else:  # the last window of this epoch: start loading the next epoch's first one
                self._load_ahead(seed, cursor.epoch + 1)
                pending = None
            skip = max(0, position - w.start)
            x, y = x[skip:], y[skip:]
            ids = self._window_rows(w)[skip:] if skipping else None
            if carry_x is not None:  # a minibatch that spans two windows
                x, y = self._cat(carry_x, x), self._cat(carry_y, y)
                ids = np.concatenate([carry_ids, ids]) if skipping else None
            whole = len(x) // self.batch_size
            for k in range(whole):
                if b >= self.batches_per_epoch:
                    return
                part = slice(k * self.batch_size, (k + 1) * self.batch_size)
                if skipping:
                    yield b, *self._out(*self._without_skipped(x[part], y[part], ids[part], cursor.epoch, b))
                else:
                    yield b, *self._out(x[part], y[part])
                b += 1
            rest = whole * self.batch_size
            carry_x, carry_y = (x[rest:], y[rest:]) if rest < len(x) else (None, None)
            carry_ids = ids[rest:] if skipping and rest < len(ids) else None
            position = w.start + w.rows

    def _window_rows(self, w: Window) -> np.ndarray:
        """The file row numbers of window `w`'s rows, in the order it serves them."""
        rows = np.concatenate([np.arange(self._group_start[g], self._group_start[g] + self.group_rows[g])
                               for g in w.groups])
        return rows[w.order]

    def _without_skipped(self, x: Any, y: Any, ids: np.ndarray, epoch: int, b: int) -> tuple[Any, Any]:
        """Minibatch `b` without the skipped rows. The minibatch keeps its place in the order: every other row
        is served in the same minibatch as without skip_rows, and every rank takes as many steps as before. So
        the order stays a function of (seed, epoch, rank) alone, a cursor means the same minibatch with and
        without skip_rows, and a retry that adds skip_rows resumes exactly where its checkpoint stopped."""
        keep = ~np.isin(ids, self.skipped)
        if keep.all():
            return x, y
        if not keep.any():
            raise ConfigError("skip_rows", f"skips every row of minibatch {b} of epoch {epoch} on rank {self.rank} "
                                           f"({len(ids)} rows)", "raise batch_size, or skip fewer rows")
        index = self._index(np.flatnonzero(keep))
        return x[index], y[index]

    def minibatch_rows(self, cursor: Cursor, seed: int) -> tuple[Any, Any, np.ndarray]:
        """Minibatch `cursor.batch` of `cursor.epoch` as batches() serves it, with the file row number of each
        of its rows: (x, y, row_ids). Reads the row groups that hold it (a replay's one read, not the
        training's windows), on the calling thread."""
        order = epoch_order(self.group_rows, seed, cursor.epoch, self.rank, self.window)
        ids = order[cursor.batch * self.batch_size:(cursor.batch + 1) * self.batch_size]
        if self.skipped.size:
            ids = ids[~np.isin(ids, self.skipped)]
        group_of = np.searchsorted(self._group_start, ids, side="right") - 1
        groups = sorted({int(g) for g in group_of})
        op = StoreOp(f"read of {self.source.key} row groups {groups}", self.source.store_uri,
                     self.source.group_bytes(groups))
        with self.progress.waiting(op):
            try:
                x, y = self._decode(self.source.read(groups, self._columns, op.moved))
            except BaseException as exc:
                op.finish(exc)
                raise
        op.finish()
        # Row r of the file is row (r - its group's start + the group's offset in what was read).
        offset = np.zeros(len(self.group_rows), dtype=np.int64)
        offset[groups] = np.concatenate([[0], np.cumsum([self.group_rows[g] for g in groups])[:-1]])
        index = self._index(ids - self._group_start[group_of] + offset[group_of])
        return (*self._out(x[index], y[index]), ids)


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A window being loaded: its store operation and the loader's future."""

    op: StoreOp
    future: concurrent.futures.Future
