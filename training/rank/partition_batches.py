"""A rank's view of the shards, streamed, as numpy arrays: one shuffle window of Parquet row groups in memory
(and the next one loading), a deterministic order per epoch, and a cursor that resumes at any minibatch.
Torch-free: the TensorFlow rank reads with it as it is, and data.py's PartitionData is the same reader serving
torch tensors (through the hooks below), so every engine trains on the same rows in the same order.

An epoch is ONE stream over the row groups ("blocks") of every partition file, its order a function of (seed, epoch) alone: the blocks permuted, taken `SHUFFLE_WINDOW` at a time, and
the rows of each window permuted among themselves (a shuffle buffer of that many blocks). The cursor names
what of the epoch is still unseen (stream_deal.py); it is dealt to the workers as contiguous runs of stream
positions, and a rank reads only the windows its run touches (a boundary window is read whole and the rows
outside the run dropped: a window's rows are mixed, so no smaller read serves them). No rank in the order is
what lets a run checkpointed on N workers resume on M, sample-exact.

The shard step already put the rows in a random order, so every block is a uniform sample of the data and
the window only has to vary the order from epoch to epoch. Because every window's size is known from the
manifest, minibatch `b` is found without reading what comes before it: resume reads
one window and starts inside it.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from ..formats.config import ConfigError, RowRef
from ..formats.tensor_columns import column_shape, tensor_matrix, value_size
from ..health.progress import Progress
from ..health.store_ops import StoreOp
from ..formats.manifest import ByteRange, ShardManifest, ShardSchema
from .host_ranges import HostRanges
from .partition_stream import StreamedPartition
from . import stream_deal
from .stream_deal import Ranges
from ..store.base import ObjectStore, TransferCancelled

# Row groups shuffled together: with the shard step's ~4 MiB row groups, a 16 MiB shuffle buffer.
SHUFFLE_WINDOW = 4
# Row groups fetched at once (a window's, with the shard step's ~4 MiB groups): each ranged read waits a
# request's latency before its first byte (tens of ms on S3, more through a slow link or from a busy server),
# and one connection seldom fills a link alone. One after another, a window of a user's size took twice as long
# through the real-size bench's link as the link's bandwidth allows (elastic_recovery_real_size.md).
FETCHES_IN_FLIGHT = SHUFFLE_WINDOW
# Windows a reader holds: the one its rank trains on and the next, loading (what a restart reads first, and what
# host_ranges.py keeps of its reads).
WINDOWS_HELD = 2
# Files a window's store operation names one by one (more are counted).
NAMED_FILES = 3
# A stream whose decoded rows take at most this is decoded once and kept, not streamed each epoch: about the
# memory two windows of the shard step's ~4 MiB row groups hold while streaming.
KEEP_DECODED_BYTES = 32 * 2**20


def decoded_row_bytes(schema: ShardSchema) -> int:
    """Bytes of one decoded row: its float32 features and its target (8 bytes, int64 or float64)."""
    return int(np.prod(schema.input_shape or (schema.num_features,))) * 4 + 8


@dataclasses.dataclass(frozen=True)
class Cursor:
    """Where training stands: the next micro-batch to take is `batch` of this rank's run of `epoch`, the
    runs dealt from `remaining` (stream_deal.py: the stream positions of the epoch unseen when they were
    dealt; None: the whole epoch) to the job's world size.

    A checkpoint stores it `settled` (batch 0, `remaining` what is still unseen), which any world size can
    deal; a resumed run continues at exactly the rows it names, so no sample is seen twice or skipped within
    an epoch.
    """

    epoch: int = 0
    batch: int = 0
    remaining: Ranges | None = None

    def __post_init__(self) -> None:
        if self.remaining is not None:
            object.__setattr__(self, "remaining", stream_deal.normalized(self.remaining))


@dataclasses.dataclass(frozen=True)
class Block:
    """One row group of one partition file: `file` is its index in the manifest, `first_row` its first row's
    number in that file (row ids are (file, row in file): stable whatever the epoch or world size)."""

    file: int
    group: int
    rows: int
    first_row: int


@dataclasses.dataclass(frozen=True)
class Window:
    """Row groups read together and the permutation of their rows; `start` is its first row in the epoch."""

    groups: tuple[int, ...]
    start: int
    order: np.ndarray = dataclasses.field(compare=False, repr=False)

    @property
    def rows(self) -> int:
        return len(self.order)


def epoch_windows(group_rows: Sequence[int], seed: int, epoch: int, window: int = SHUFFLE_WINDOW) -> list[Window]:
    """The order of one epoch: row groups permuted, `window` at a time, rows permuted within each window.
    Pure: depends on the row-group sizes and (seed, epoch) alone, the same for every rank and world size."""
    if window < 1:
        raise ValueError(f"shuffle window is {window}; use >= 1 row group")
    key = [seed, epoch]
    rng = np.random.default_rng(key)
    groups = rng.permutation(len(group_rows))
    out, start = [], 0
    for i in range(0, len(groups), window):
        chosen = tuple(int(g) for g in groups[i:i + window])
        rows = sum(group_rows[g] for g in chosen)
        out.append(Window(chosen, start, np.random.default_rng([*key, i]).permutation(rows)))
        start += rows
    return out


def epoch_order(group_rows: Sequence[int] | int, seed: int, epoch: int, window: int = SHUFFLE_WINDOW) -> np.ndarray:
    """Every row of the stream (numbered in block order) in the order epoch `epoch` serves them: for tests
    and tools; training never materializes it. An int is one row group of that many rows."""
    sizes = [group_rows] if isinstance(group_rows, int) else list(group_rows)
    first_row = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    parts = []
    for w in epoch_windows(sizes, seed, epoch, window):
        rows = np.concatenate([np.arange(first_row[g], first_row[g] + sizes[g]) for g in w.groups])
        parts.append(rows[w.order])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def to_arrays(table: "pa.Table | pa.RecordBatch", schema: ShardSchema) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a table of stored rows: x float32 of shape (rows, *schema.input_shape), normalized with the
    manifest's mean/std; y int64 class indices or float32 values."""
    if not isinstance(table, (pa.Table, pa.RecordBatch)):  # a DataFrame (older callers)
        table = pa.Table.from_pandas(table, preserve_index=False)
    # Each column's chunks written straight into one (rows, elements) matrix, then normalized in place, all
    # columns at once: no column is concatenated from its chunks first (a window read from several files has
    # one chunk per file) and no per-column temporaries (the loader thread shares the rank's core with
    # training: bench/results/stream_profile.md). The same float32 operations as column by column.
    rows = table.num_rows
    widths = [value_size(column_shape(table.schema.field(spec.name).type)[0]) for spec in schema.feature_columns]
    starts = np.concatenate([[0], np.cumsum(widths)]).astype(int).tolist()
    x = np.empty((rows, starts[-1]), dtype=np.float32)
    for i, spec in enumerate(schema.feature_columns):
        column, at = table.column(spec.name), 0
        for chunk in (column.chunks if isinstance(column, pa.ChunkedArray) else [column]):
            values = _plain(chunk)
            values = tensor_matrix(chunk, np.float32)[0] if values is None else values.reshape(-1, 1)
            x[at:at + len(values), starts[i]:starts[i + 1]] = values
            at += len(values)
    if schema.feature_mean:
        x -= np.repeat(np.asarray(schema.feature_mean, dtype=np.float32), widths)
        x /= np.repeat(np.asarray(schema.feature_std, dtype=np.float32), widths)
    x = x.reshape(rows, *schema.input_shape)
    target = table.column(schema.target)
    plain = [_plain(c) for c in (target.chunks if isinstance(target, pa.ChunkedArray) else [target])]
    y = (np.concatenate(plain) if plain else np.zeros(0)) if all(v is not None for v in plain) else target.to_numpy()
    return x, y.astype(np.int64) if schema.task == "classification" else y.astype(np.float32)


def _plain(chunk: "pa.Array") -> np.ndarray | None:
    """A chunk of plain numbers without nulls, as a numpy view of its buffer; None for any other. Not
    Array.to_numpy: its first call imports pandas (~0.4 s, on the loader thread of a rank that otherwise never
    imports it: bench/results/stream_profile.md)."""
    if chunk.null_count or not (pa.types.is_floating(chunk.type) or pa.types.is_integer(chunk.type)):
        return None
    dtype = np.dtype(chunk.type.to_pandas_dtype())
    return np.frombuffer(chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)


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
    """This rank's share of the shards, streamed. `batches(seed, cursor)` yields (batch_index, x, y) for the
    cursor's epoch from its micro-batch on, reading one window of row groups at a time while the next one
    loads; `row_ids` then holds the (file, row in file) of each row of the micro-batch last yielded.
    x and y are numpy arrays here; a subclass serves its library's tensors through the hooks `_decode`,
    `_index`, `_pin`, `_cat` and `_out` (data.py's PartitionData).

    The files come from `store` (partition_stream.StreamedPartition: ranged reads of their row groups, each
    checked as it arrives), opened when first read. Opening and each window's read are store operations (health/store_ops.py); when the training thread
    has to wait for one, it waits through `progress` (the store is judged, not the thread).

    placement: where a subclass puts the batches (data.py: devices.py's Placement); unused here.
    skip_rows: rows never served (the job config's skip_rows); those of other partitions are ignored here.
    host_ranges: where the ranges read are kept on this host for a restart, and read from when kept (an
    elastic DDP job's, host_ranges.py); `first_ranges` says which a commit pins."""

    def __init__(self, store: ObjectStore, manifest: ShardManifest, rank: int, world_size: int, batch_size: int,
                 window: int = SHUFFLE_WINDOW, placement: Any = None,
                 progress: Progress | None = None, skip_rows: Sequence[RowRef] = (),
                 host_ranges: HostRanges | None = None):
        self.progress = progress or Progress()
        self._store = store
        self._host_ranges = host_ranges
        self._sources: dict[int, StreamedPartition] = {}
        # One stream over every file, dealt to the world: the rank is not in the order.
        self.entries = manifest.partitions
        self.deal_size, self.deal_rank = world_size, rank
        sizes = [[g.rows for g in e.row_groups] for e in self.entries]
        self.blocks = tuple(Block(f, g, rows, first) for f, rows_of in enumerate(sizes)
                            for g, (rows, first) in enumerate(zip(rows_of, np.concatenate(
                                [[0], np.cumsum(rows_of)[:-1]]).astype(int).tolist())))
        self.schema = manifest.schema
        self.group_rows = [b.rows for b in self.blocks]
        self.stream_rows = sum(self.group_rows)
        self.rank = rank
        self.batch_size = batch_size
        self.window = window
        self.rows = stream_deal.length(self._run(Cursor()))  # this rank's rows of a whole epoch
        self.batches_per_epoch = self.micro_batches(Cursor())
        self.row_ids: np.ndarray = np.zeros((0, 2), dtype=np.int64)
        self.placement = placement
        self._columns = [*manifest.schema.features, manifest.schema.target]
        # A stream of one window, or one whose decoded rows take at most KEEP_DECODED_BYTES, is decoded once and
        # kept (on its first load): streaming holds about that much in memory anyway (a window and the next one
        # loading), and decoding it again each epoch took ~9 % of a small model's training time on the critical
        # path at every epoch start (bench/results/throughput.md), and a third of a user script's, whose loader
        # thread has no idle core to run on beside two ranks on two (bench/results/user_script.md). Larger
        # ones stream.
        self._keep_decoded = (len(self.group_rows) <= window
                              or self.stream_rows * decoded_row_bytes(manifest.schema) <= KEEP_DECODED_BYTES)
        self._decoded: tuple[Any, Any] | None = None
        self._group_start = np.concatenate([[0], np.cumsum(self.group_rows)[:-1]]).astype(np.int64)
        check_skip_rows(skip_rows, manifest, store.uri)
        # As keys of this reader's (file, row in file) ids: rows of files it does not read are not its to skip.
        files = {e.key: f for f, e in enumerate(self.entries)}
        self._skipped = np.unique(_row_key(np.array([(files[r.file], r.row) for r in skip_rows if r.file in files],
                                                    dtype=np.int64).reshape(-1, 2)))
        # One loader thread: Parquet decoding releases the GIL, so the next window loads while this one trains.
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringflow-prefetch")
        self._fetcher = concurrent.futures.ThreadPoolExecutor(max_workers=FETCHES_IN_FLIGHT,
                                                              thread_name_prefix="ringflow-fetch")
        self._closed = threading.Event()
        # (seed, epoch, window start, this rank's spans of it), its load
        self._ahead: tuple[tuple, "_Pending"] | None = None
        self._epoch_windows: tuple[tuple[int, int], list[Window]] | None = None  # the last (seed, epoch)'s

    def __len__(self) -> int:
        return self.rows

    def close(self) -> None:
        """Stop the loader thread: this reader serves nothing more. A load in flight is dropped and its read
        abandoned at its next chunk (TransferCancelled): left to run, it would share the link with the next
        reader's first window, which an elastic job's survivors wait for (a window of a user's size through a
        slow link: seconds)."""
        self._closed.set()
        self._loader.shutdown(wait=False, cancel_futures=True)
        self._fetcher.shutdown(wait=False, cancel_futures=True)

    def prefetch(self, seed: int, cursor: Cursor) -> None:
        """Start loading the cursor's first window now, for the batches(seed, cursor) call that comes next: a
        trainer calls it once it knows where it resumes, so the window loads while the rest of it is built, and
        a checkpoint upload in flight (an elastic job's, going on from the round before) gives way to it."""
        pending = self._load_ahead(seed, cursor)
        if pending is not None:
            self.progress.data_first_until(pending.future)

    def _source(self, file: int, moved: Callable[[int], None] | None = None) -> StreamedPartition:
        """File `file`, opened on first use (its footer read and checked: a store operation).

        moved: given by a window's load on the loader thread, whose operation the open is part of (the
        training thread's wait, if any, is for that window). Progress.waiting is the training thread's
        alone: entered from the loader thread too, the two threads' nested waits would restore each
        other's, leaving a finished open as the wait of a thread that has moved on, idle until
        store_timeout_seconds made it STORE_UNAVAILABLE."""
        if file not in self._sources:
            entry = self.entries[file]
            if moved is not None:
                self._sources[file] = StreamedPartition(self._store, entry, moved, self._host_ranges)
                return self._sources[file]
            opening = StoreOp(f"read of {entry.key}'s index", self._store.uri, None)
            with self.progress.waiting(opening):
                self._sources[file] = StreamedPartition(self._store, entry, opening.moved, self._host_ranges)
            opening.finish()
        return self._sources[file]

    # -- the deal ------------------------------------------------------------------------------------------

    def _remaining(self, cursor: Cursor) -> Ranges:
        return stream_deal.whole(self.stream_rows) if cursor.remaining is None else cursor.remaining

    def _run(self, cursor: Cursor) -> Ranges:
        """This rank's run of the cursor's deal."""
        return stream_deal.deal(self._remaining(cursor), self.deal_size)[self.deal_rank]

    def micro_batches(self, cursor: Cursor) -> int:
        """Micro-batches every rank takes in the cursor's deal (the same on every rank)."""
        return stream_deal.micro_batches(self._remaining(cursor), self.deal_size, self.batch_size)

    def uneven(self, cursor: Cursor = Cursor()) -> bool:
        """Whether the cursor's deal gives some rank a partial or an empty micro-batch."""
        return stream_deal.length(self._remaining(cursor)) % (self.deal_size * self.batch_size) != 0

    def settled(self, cursor: Cursor) -> Cursor:
        """The same position as a cursor any world size can deal: batch 0, what is still unseen remaining."""
        if cursor.batch == 0:
            return cursor
        left = stream_deal.advance(self._remaining(cursor), self.deal_size, self.batch_size, cursor.batch)
        return Cursor(cursor.epoch + 1) if not left else Cursor(cursor.epoch, 0, left)

    @property
    def epoch_rows(self) -> int:
        """Rows an epoch trains on: the whole stream."""
        return self.stream_rows

    def rows_seen(self, cursor: Cursor) -> int:
        """Rows of cursor.epoch trained on before the cursor (of epoch_rows): the same count on any world size
        and batch, so progress measured in them never jumps on a resume (callbacks/trainer_status.py)."""
        settled = self.settled(cursor)
        if settled.epoch > cursor.epoch:
            return self.stream_rows
        return self.stream_rows - stream_deal.length(self._remaining(settled))

    # -- loading -------------------------------------------------------------------------------------------

    def _submit(self, w: Window, spans: tuple[tuple[int, int], ...]) -> "_Pending":
        """Load this rank's rows of window `w` in the background: its `spans`, [first, end) positions of the
        permuted window (the others' rows are never gathered)."""
        blocks = range(len(self.group_rows)) if self._keep_decoded and self._decoded is None else w.groups
        keys = sorted({self.entries[self.blocks[b].file].key for b in blocks})
        # Named, so a heartbeat that says "waiting" says for which files (a window of the stream spans several).
        where = ", ".join(keys) if len(keys) <= NAMED_FILES else f"{keys[0]} and {len(keys) - 1} other files"
        op = StoreOp(f"read of {where} row groups {sorted(blocks)}", self._store.uri, self._bytes(blocks))
        return _Pending(op, self._loader.submit(self._load, w, op, spans), w.start)

    def _moved(self, op: StoreOp) -> Callable[[int], None]:
        """The load's progress: the op's bytes, until the reader is closed."""
        def moved(nbytes: int) -> None:
            if self._closed.is_set():
                raise TransferCancelled(f"{op.what}: the reader was closed")
            op.moved(nbytes)
        return moved

    def _bytes(self, blocks: Sequence[int]) -> int:
        entries = [self.entries[self.blocks[b].file] for b in blocks]
        return sum(e.row_groups[self.blocks[b].group].length for e, b in zip(entries, blocks))

    def _read(self, blocks: Sequence[int], moved) -> tuple["pa.Table", np.ndarray | None]:
        """The rows of `blocks`: their row groups fetched FETCHES_IN_FLIGHT at a time, each file's decoded in
        one read, the files' tables joined as they came (a chunk each, no copy), and which of its rows are
        `blocks`' rows in that order (None: all of them, in order). Not sliced into blocks and put back in
        order here: that left a chunk per block, which to_arrays then had to join column by column
        (bench/results/stream_profile.md); the order is a permutation the window's gather takes for free."""
        by_file: dict[int, list[int]] = {}
        for b in blocks:
            by_file.setdefault(self.blocks[b].file, []).append(b)
        sources = {file: self._source(file, moved) for file in by_file}  # opened (their footers) one by one
        wanted = [b for mine in by_file.values() for b in mine]
        try:
            fetched = dict(zip(wanted, self._fetcher.map(
                lambda b: sources[self.blocks[b].file].fetch(self.blocks[b].group, moved), wanted)))
        except (RuntimeError, concurrent.futures.CancelledError):
            # close() shut the pool down meanwhile: it refused the rest ("cannot schedule new futures after
            # shutdown") or cancelled those still queued.
            if self._closed.is_set():
                raise TransferCancelled("the window's read: the reader was closed") from None
            raise
        if self._host_ranges is not None:  # for the workers a restart brings, before anything can fail here
            self._host_ranges.keep([*((self.entries[f].footer, sources[f].footer) for f in by_file),
                                    *((self._range(b), fetched[b]) for b in wanted)])
        tables, start, at = [], {}, 0
        for file, mine in by_file.items():
            tables.append(sources[file].table({self.blocks[b].group: fetched[b] for b in mine}, self._columns))
            for b in mine:
                start[b], at = at, at + self.blocks[b].rows
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        if [start[b] for b in blocks] == sorted(start.values()):
            return table, None
        return table, np.concatenate([np.arange(start[b], start[b] + self.blocks[b].rows) for b in blocks])

    def _range(self, block: int) -> ByteRange:
        """Block `block`'s row group, as the manifest lists it."""
        return self.entries[self.blocks[block].file].row_groups[self.blocks[block].group]

    def first_ranges(self, seed: int, cursor: Cursor, windows: int = WINDOWS_HELD) -> list[ByteRange]:
        """What a reader of this rank at `cursor` reads first: the row groups of its first `windows` windows
        (all of them for a stream decoded once and kept) and their files' footers. A commit pins them on the
        host (host_ranges.py), so the workers restarted from it read them from memory."""
        if self._keep_decoded:
            blocks: list[int] = list(range(len(self.blocks)))
        else:
            first: list[Window] = []
            for w, _, _ in self._pieces(seed, cursor):
                if w not in first:
                    first.append(w)
                if len(first) == windows:
                    break
            blocks = [b for w in first for b in w.groups]
        files = sorted({self.blocks[b].file for b in blocks})
        return [*(self.entries[f].footer for f in files), *(self._range(b) for b in blocks)]

    def _ids(self, blocks: Sequence[int]) -> np.ndarray:
        """(file, row in file) of every row of `blocks`, in that order."""
        files = np.concatenate([np.full(self.blocks[b].rows, self.blocks[b].file) for b in blocks])
        rows = np.concatenate([np.arange(self.blocks[b].first_row, self.blocks[b].first_row + self.blocks[b].rows)
                               for b in blocks])
        return np.stack([files, rows], axis=1).astype(np.int64)

    def _wait(self, pending: "_Pending") -> "_Loaded":
        """The window's tensors and row ids; a wait for them is a wait for the store, and for data (a checkpoint
        upload gives way to it: Progress.awaiting_data)."""
        if not pending.future.done():
            with self.progress.awaiting_data(pending.op):
                return pending.future.result()
        return pending.future.result()

    def _load(self, w: Window, op: StoreOp, spans: tuple[tuple[int, int], ...]) -> "_Loaded":
        moved = self._moved(op)
        try:
            order = w.order[np.concatenate([np.arange(a, b) for a, b in spans]).astype(np.int64)
                            if spans else np.zeros(0, dtype=np.int64)]
            ids = self._ids(w.groups)[order]
            if not self._keep_decoded:
                table, read_order = self._read(w.groups, moved)
                x, y = self._decode(table)
                index = self._index(order if read_order is None else read_order[order])
            else:  # this rank's rows of the window, permuted, picked straight from the decoded stream
                if self._decoded is None:  # rows in block order
                    table, read_order = self._read(range(len(self.blocks)), moved)
                    x, y = self._decode(table)
                    if read_order is not None:
                        x, y = x[self._index(read_order)], y[self._index(read_order)]
                    self._decoded = x, y
                x, y = self._decoded
                rows = np.concatenate([np.arange(self._group_start[g], self._group_start[g] + self.group_rows[g])
                                       for g in w.groups])
                index = self._index(rows[order])
            x, y = self._pin(x[index], y[index])
        except BaseException as exc:
            op.finish(exc)
            raise
        op.finish()
        offsets, at = {}, 0
        for a, b in spans:
            offsets[a], at = at, at + b - a
        return _Loaded(x, y, ids, offsets)

    def _pieces(self, seed: int, cursor: Cursor) -> list[tuple[Window, int, int]]:
        """(window, first, end) of every window this rank reads from the cursor on, in stream order: rows
        [first, end) of the permuted window are this rank's."""
        windows = self._windows(seed, cursor.epoch)
        run = self._run(cursor)
        skip = cursor.batch * self.batch_size
        mine = stream_deal.cut(run, skip, stream_deal.length(run) - skip)
        out = []
        for start, stop in mine:
            for w in windows:
                lo, hi = max(start, w.start), min(stop, w.start + w.rows)
                if lo < hi:
                    out.append((w, lo - w.start, hi - w.start))
        return out

    def _windows(self, seed: int, epoch: int) -> list[Window]:
        """epoch_windows of this stream, the last epoch's kept: a commit's first_ranges asks for the epoch the
        loop is in, whose windows (with their rows' orders) are otherwise made anew each time."""
        if self._epoch_windows is None or self._epoch_windows[0] != (seed, epoch):
            self._epoch_windows = ((seed, epoch), epoch_windows(self.group_rows, seed, epoch, self.window))
        return self._epoch_windows[1]

    def _load_ahead(self, seed: int, cursor: Cursor) -> "_Pending | None":
        """Start loading the cursor's first window for the batches() call that comes next, so no epoch starts
        by waiting for its data (a stream of one window waited at every epoch); its load (None: nothing left
        to read). After the last epoch this loads one window that nobody takes."""
        pieces = self._pieces(seed, cursor)
        if not pieces:
            return None
        spans = _spans(pieces, pieces[0][0])
        pending = self._submit(pieces[0][0], spans)
        self._ahead = ((seed, cursor.epoch, pieces[0][0].start, spans), pending)
        return pending

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
        """Yield (batch_index, x, y) for cursor.epoch from cursor.batch on: this rank's run of the cursor's
        deal in micro-batches of batch_size, the last one partial, then (a rank whose run is shorter) empty
        ones up to micro_batches(cursor), so every rank takes the same number."""
        count = self.micro_batches(cursor)
        pieces = self._pieces(seed, cursor)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and pieces and ahead[0] == (seed, cursor.epoch, pieces[0][0].start,
                                                         _spans(pieces, pieces[0][0])):
            pending = ahead[1]  # loaded while the previous epoch's last window trained
        else:
            pending = self._submit(pieces[0][0], _spans(pieces, pieces[0][0])) if pieces else None
        size, b = self.batch_size, cursor.batch
        carry: tuple[Any, Any, np.ndarray] | None = None
        loaded: tuple[Window, _Loaded] | None = None
        for i, (w, first, end) in enumerate(pieces):
            if loaded is None or loaded[0] != w:
                loaded = (w, self._wait(pending))
                # Pieces are in stream order, so a window's pieces are consecutive: the next one to load is
                # the next piece's of another window; after the last, the next epoch's first window.
                following = next((p[0] for p in pieces[i + 1:] if p[0] != w), None)
                if following is not None:
                    pending = self._submit(following, _spans(pieces, following))
                else:
                    self._load_ahead(seed, Cursor(cursor.epoch + 1))
                    pending = None
            at = loaded[1].offsets[first]
            x, y, ids = (part[at:at + end - first] for part in loaded[1][:3])
            if carry is not None:  # a micro-batch that spans two pieces
                x, y, ids = self._cat(carry[0], x), self._cat(carry[1], y), np.concatenate([carry[2], ids])
                carry = None
            whole = len(x) // size
            for k in range(whole):
                if b >= count:
                    return
                yield b, *self._serve(x[k * size:(k + 1) * size], y[k * size:(k + 1) * size],
                                      ids[k * size:(k + 1) * size])
                b += 1
            rest = whole * size
            if rest < len(x):
                carry = (x[rest:], y[rest:], ids[rest:])
        if carry is not None and b < count:
            yield b, *self._serve(*carry)
            b += 1
        while b < count:  # this rank's run is over: an empty micro-batch, so it still joins every step
            x, y = self._empty(seed, cursor.epoch, loaded)
            self.row_ids = np.zeros((0, 2), dtype=np.int64)
            yield b, *self._out(x, y)
            b += 1

    def _serve(self, x: Any, y: Any, ids: np.ndarray) -> tuple[Any, Any]:
        """One micro-batch as the loop takes it, without the skipped rows (skip_rows), its rows' ids in
        `row_ids`. The micro-batch keeps its place in the deal: every other row is served in the same
        micro-batch as without skip_rows, and every rank takes as many micro-batches as before, so a cursor
        means the same rows with and without skip_rows and a retry that adds them resumes exactly where its
        checkpoint stopped. Fewer rows than batch_size weigh as a partial micro-batch's (loop.partial_loss);
        none at all, as an empty one's (loop.empty_loss)."""
        if self._skipped.size:
            keep = ~np.isin(_row_key(ids), self._skipped)
            if not keep.all():
                index = self._index(np.flatnonzero(keep))
                x, y, ids = x[index], y[index], ids[keep]
        self.row_ids = ids
        return self._out(x, y)

    def _empty(self, seed: int, epoch: int, loaded) -> tuple[Any, Any]:
        """A micro-batch of no rows, shaped as the others (from the last window loaded, or the epoch's first)."""
        if loaded is None:
            first = self._windows(seed, epoch)[0]
            loaded = (first, self._wait(self._submit(first, ())))
        x, y = loaded[1].x, loaded[1].y
        return x[:0], y[:0]

    def minibatch_rows(self, cursor: Cursor, seed: int) -> tuple[Any, Any, np.ndarray]:
        """The exact micro-batch `cursor` serves this rank, and its rows' (file, row in file) ids."""
        for _, x, y in self.batches(seed, cursor):
            return x, y, self.row_ids
        raise ValueError(f"cursor {cursor} is past this rank's last micro-batch ({self.micro_batches(cursor)})")

    def row_keys(self, ids: np.ndarray) -> list[str]:
        """Row ids as "<file key>:<row in file>" (what a report names)."""
        return [f"{self.entries[int(f)].key}:{int(r)}" for f, r in ids]



def _row_key(ids: np.ndarray) -> np.ndarray:
    """One int64 per (file, row in file) id: the file index above the row's 40 bits (a file of < 2**40 rows)."""
    return (ids[:, 0] << 40) | ids[:, 1]


class _Loaded(NamedTuple):
    """This rank's rows of a window, permuted: x, y, their (file, row in file) ids, and where each of the rank's
    spans of the window ([first, end) of the permuted window) starts in them."""

    x: Any
    y: Any
    ids: np.ndarray
    offsets: dict[int, int]


def _spans(pieces: list[tuple[Window, int, int]], w: Window) -> tuple[tuple[int, int], ...]:
    """This rank's [first, end) spans of window `w`, from its pieces."""
    return tuple((first, end) for pw, first, end in pieces if pw == w)


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A window being loaded: its store operation, the loader's future, and the window's first position."""

    op: StoreOp
    future: concurrent.futures.Future
    start: int = 0
