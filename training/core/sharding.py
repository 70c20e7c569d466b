"""Split a dataset into partitions of whole minibatches plus an eval split (manifest.py's format),
streaming: memory stays that of a few record batches and one spill bucket, whatever the dataset's size.

The shuffle is exact and deterministic without holding the rows: `shuffled_positions` maps every row number to
its place in a pseudo-random permutation of all rows (a keyed Feistel network, cycle-walked onto range(rows)),
computed batch by batch from (seed, row number) alone. `ShardPlan.place` turns a place into a destination
(partition or eval) and a slot in it, exactly as "shuffle, take the eval rows first, stride the rest over the
partitions, move what does not fill a whole minibatch everywhere to eval".

Two passes, both Arrow streams:
1. Scan the dataset's record batches once: the input gate, the content fingerprint, the target's kind and the
   features' mean/std on the training rows; each batch's rows go to spill buckets (Arrow IPC files in a
   temporary folder on local disk) by destination and slot range. A wide Parquet table is scanned one column
   group at a time (datasets.Dataset.column_groups: a Parquet reader holds pages of every column it streams),
   each group spilling its own columns; the statistics are per column, so they do not notice.
2. Per destination, read its buckets in slot order (every column group's file of a bucket, side by side), sort
   each (it is small), and append it to a ParquetWriter in row groups of `row_group_rows`; sha256 is computed
   over the bytes as they are written. Destinations are written in parallel (Parquet encoding releases the
   GIL), as many as the cores and the memory left allow (memory_budget), then uploaded (`put_file`: multipart
   on S3).

The spill needs local disk about the size of the (float32) training data, and is removed afterwards.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..formats.datasets import ContentHash, Dataset, as_dataset
from ..formats.tensor_columns import column_shape, row_bytes, tensor_matrix
from .input_gate import InputGate, check_trainable, feature_columns
from ..formats.manifest import (
    MANIFEST_NAME, ColumnSpec, ManifestError, PartitionEntry, ShardManifest, ShardSchema, sha256_hex,
)
from .memory_budget import available_memory
from ..formats.partition_index import index_parquet_file
from ..store.base import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

# A target with at most this many distinct integer values is taken as class labels.
_MAX_INFERRED_CLASSES = 100
# A Parquet row group of a partition holds about this many bytes (whole minibatches): what a rank reads at once.
ROW_GROUP_BYTES = 2 * 2**20
# A spill bucket holds about this many bytes: what pass 2 holds per destination being written.
SPILL_BUCKET_BYTES = 8 * 2**20
# Partitions written at once, at most (each by a thread: Parquet encoding releases the GIL), and what one
# writer holds: a spill bucket read, sorted and cast (measured: about 40 MiB of Arrow memory), and its allocator's
# slack. The writers are as many as the cores, the partitions and the memory left allow.
MAX_WRITERS = 4
WRITER_BYTES = 64 * 2**20
# Spill files open at once, at most: the process's open-file limit is raised to its hard limit for them.
# Past SPILL_BUCKET_BYTES x this many bytes (80 GiB at 10,000 files) buckets grow with the data.
MAX_SPILL_FILES = 10_000
_SPARE_FILES = 64
_SLOT = "__ringflow_slot"
_FEISTEL_ROUNDS = 4
_MASK64 = (1 << 64) - 1


# -- the shuffle: pure functions -------------------------------------------------------------------------

def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (wrapping arithmetic): a strong, cheap bit mixer."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _round_keys(seed: int) -> list[np.uint64]:
    keys, state = [], (int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK64
    for _ in range(_FEISTEL_ROUNDS):
        state = int(_mix(np.array([state], dtype=np.uint64))[0])
        keys.append(np.uint64(state))
    return keys


def shuffled_positions(rows: np.ndarray, num_rows: int, seed: int) -> np.ndarray:
    """Where each row number in `rows` lands in a pseudo-random permutation of range(num_rows) that depends
    on `seed` alone: a bijection, so every position is taken exactly once, computed for any subset of rows
    without the others (which is what lets the shard step stream)."""
    if num_rows < 1:
        return np.zeros(0, dtype=np.int64)
    half = max(1, ((num_rows - 1).bit_length() + 1) // 2)
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    keys = _round_keys(seed)
    x = np.asarray(rows, dtype=np.uint64).copy()
    todo = np.arange(len(x))
    while len(todo):  # cycle-walking: values that leave range(num_rows) go round again, until inside
        v = x[todo]
        left, right = v >> shift, v & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        x[todo] = (left << shift) | right
        todo = todo[x[todo] >= num_rows]
    return x.astype(np.int64)


class TooFewRows(ManifestError):
    """The dataset cannot fill one minibatch in each partition (or has no rows at all)."""


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """How many rows go where. Destinations 0..partitions-1 are the partitions, `partitions` is eval."""

    rows: int
    partitions: int
    batch_size: int
    eval_fraction: float

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.batch_size < 1:
            raise ManifestError("num_partitions and batch_size must be >= 1")
        if not 0 <= self.eval_fraction < 1:
            raise ManifestError(f"eval_fraction is {self.eval_fraction}; use a fraction in [0, 1)")
        if self.rows == 0:
            raise TooFewRows("the dataset has no rows; check the export that wrote it (or the path), then shard again")
        if self.batches == 0:
            raise TooFewRows(
                f"{self.rows - self.eval_rows} training rows cannot fill one minibatch of {self.batch_size} on "
                f"each of {self.partitions} partitions; lower batch_size or the number of partitions, or use more data")

    @property
    def eval_rows(self) -> int:
        """Rows drawn for eval (the remainder is added to them)."""
        return int(round(self.rows * self.eval_fraction))

    @property
    def batches(self) -> int:
        """Whole minibatches per partition."""
        return (self.rows - self.eval_rows) // (self.partitions * self.batch_size)

    @property
    def partition_rows(self) -> int:
        return self.batches * self.batch_size

    @property
    def remainder(self) -> int:
        return self.rows - self.eval_rows - self.partitions * self.partition_rows

    def destination_rows(self, destination: int) -> int:
        return self.partition_rows if destination < self.partitions else self.eval_rows + self.remainder

    def place(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(destination, slot in it) for each shuffled position: eval takes the first positions, the rest
        is strided over the partitions, and what is left after whole minibatches goes to eval too."""
        used = self.partitions * self.partition_rows
        train = positions - self.eval_rows
        to_eval = (positions < self.eval_rows) | (train >= used)
        destination = np.where(to_eval, self.partitions, train % self.partitions)
        slot = np.where(positions < self.eval_rows, positions,
                        np.where(train >= used, positions - used, train // self.partitions))
        return destination, slot


# -- streaming statistics --------------------------------------------------------------------------------

class _Moments:
    """Mean and standard deviation of one feature over batches (Chan's parallel update, float64)."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, values: np.ndarray) -> None:
        n = values.size
        if not n:
            return
        mean = float(values.mean(dtype=np.float64))
        m2 = float(((values.astype(np.float64) - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        spread = math.sqrt(self.m2 / self.count) if self.count else 0.0
        return spread if spread > 0 else 1.0


class _TargetStats:
    """What the task inference needs of the target, without holding it."""

    def __init__(self) -> None:
        self.integral, self.minimum, self.maximum, self.distinct = True, None, None, set()

    def add(self, column: pa.Array) -> None:
        if not (pa.types.is_integer(column.type) or pa.types.is_boolean(column.type)):
            self.integral = False
        values = column.to_numpy(zero_copy_only=False)
        if not len(values):
            return
        low, high = values.min(), values.max()
        self.minimum = low if self.minimum is None else min(self.minimum, low)
        self.maximum = high if self.maximum is None else max(self.maximum, high)
        if self.integral and len(self.distinct) <= _MAX_INFERRED_CLASSES:
            self.distinct.update(np.unique(values).tolist())

    def task(self) -> str:
        return "classification" if self.integral and len(self.distinct) <= _MAX_INFERRED_CLASSES else "regression"


# -- the writer ------------------------------------------------------------------------------------------

class _HashingFile:
    """A write-only file that hashes what passes through it: the partition's sha256 while it is written."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "wb")
        self.sha256 = hashlib.sha256()
        self.closed = False

    def write(self, data) -> int:
        self.sha256.update(data)
        return self._file.write(data)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self.closed = True


def _features_as_stored(batch: pa.RecordBatch, features: Sequence[str]) -> list[pa.Array]:
    """Every feature as float32, tensor-valued ones keeping their shape (a fixed-size list per level)."""
    out = []
    for name in features:
        column = batch.column(name)
        shape, _ = column_shape(column.type)
        values, _ = tensor_matrix(column, np.float32)
        array: pa.Array = pa.array(values.reshape(-1))
        for size in reversed(shape):
            array = pa.FixedSizeListArray.from_arrays(array, size)
        out.append(array)
    return out


def _stored_type(shape: tuple[int, ...]) -> pa.DataType:
    type_: pa.DataType = pa.float32()
    for size in reversed(shape):
        type_ = pa.list_(type_, size)
    return type_


def _open_file_budget() -> int:
    """How many spill files may be open at once: MAX_SPILL_FILES, within the open-file limit (the soft limit
    is raised to the hard one first; 1024 is a common soft default)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = MAX_SPILL_FILES + _SPARE_FILES
        if soft != resource.RLIM_INFINITY and soft < wanted:
            target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        limit = MAX_SPILL_FILES if soft == resource.RLIM_INFINITY else soft - _SPARE_FILES
    except (ImportError, ValueError, OSError):
        limit = 1024 - _SPARE_FILES
    return max(16, min(MAX_SPILL_FILES, limit))


def _spill_name(destination: int, bucket: int, group: int) -> str:
    return f"{destination}-{bucket}-{group}.arrow"


@dataclasses.dataclass(frozen=True)
class ShardResult:
    manifest: ShardManifest
    store: ObjectStore
    reused: bool  # the shards were already there: nothing was written


def shard(
    data: "Dataset | pa.Table | pd.DataFrame",
    destination: Callable[[str], ObjectStore],
    *,
    target: str,
    num_partitions: int,
    batch_size: int,
    seed: int = 0,
    eval_fraction: float = 0.2,
    features: Sequence[str] | None = None,
    task: str | None = None,
    source_uri: str = "",
) -> ShardResult:
    """Shard `data` into the store `destination(content_sha256)` picks. A rerun with the same data and
    parameters finds that store's manifest and rewrites nothing; a manifest of other data or parameters
    there is an error. Data training cannot use is refused (input_gate.UntrainableData) before anything is
    written."""
    if isinstance(data, pd.DataFrame):  # mixed-type object columns cannot become Arrow: judge them first
        check_trainable(data, target, features, dataset=source_uri)
    dataset = as_dataset(data, source_uri)
    columns = dataset.columns
    gate = InputGate(columns, target, features)
    if target not in columns or any(f not in columns for f in feature_columns(columns, target, features)):
        gate.check(source_uri)  # names the missing columns
    features = feature_columns(columns, target, features)
    plan = ShardPlan(dataset.num_rows, num_partitions, batch_size, eval_fraction)
    wanted = [*features, target]
    schema = pa.schema([dataset.schema.field(c) for c in wanted])
    shapes = [column_shape(schema.field(f).type)[0] for f in features]
    stored_row = row_bytes(pa.schema([(f, _stored_type(s)) for f, s in zip(features, shapes)])) + 8
    row_group_rows = max(1, ROW_GROUP_BYTES // (stored_row * batch_size)) * batch_size
    max_files = _open_file_budget() - num_partitions - 1
    groups_per_bucket = max(1, SPILL_BUCKET_BYTES // (stored_row * row_group_rows),
                            math.ceil(plan.rows / max(1, max_files) / row_group_rows))
    bucket_rows = groups_per_bucket * row_group_rows
    stride = plan.rows // bucket_rows + 2  # more buckets than any destination has

    groups = dataset.column_groups(wanted)
    index_of = {f: i for i, f in enumerate(features)}

    spill = tempfile.mkdtemp(prefix="ringflow-shard-")
    try:
        hasher, moments, target_stats = ContentHash(schema), [_Moments() for _ in features], _TargetStats()

        def tally(batch: pa.RecordBatch, stored: Sequence[tuple[str, pa.Array]], training: np.ndarray) -> None:
            hasher.update(batch)
            for name, array in stored:
                moments[index_of[name]].add(tensor_matrix(array, np.float32)[0][training])

        # The fingerprint's sha256 and the features' moments run on the other core (hashlib and numpy release
        # the GIL), in batch order, one batch behind at most.
        tallying = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringflow-tally")
        try:
            # One pass per column group (one for a narrow table): each spills its columns to files of their own,
            # `<destination>-<bucket>-<group>.arrow`, and every group's file of a bucket holds the same rows in
            # the same order (ascending row numbers), so pass 2 puts the columns side by side.
            for g, names in enumerate(groups):
                group_features = [f for f in features if f in names]
                writers: dict[tuple[int, int], pa.ipc.RecordBatchStreamWriter] = {}
                offset, tallied = 0, None
                try:
                    for batch in dataset.batches(names):
                        if tallied is not None:
                            tallied.result()
                        gate.add(batch)
                        n = batch.num_rows
                        if gate.problems():  # keep counting every bad row; nothing more to prepare
                            tallied = tallying.submit(hasher.update, batch)
                            offset += n
                            continue
                        destination_of, slot = plan.place(
                            shuffled_positions(np.arange(offset, offset + n), plan.rows, seed))
                        offset += n
                        arrays = _features_as_stored(batch, group_features)
                        tallied = tallying.submit(tally, batch, list(zip(group_features, arrays)),
                                                  destination_of < num_partitions)
                        out_names = list(group_features)
                        if target in names:
                            target_stats.add(batch.column(target))
                            arrays.append(batch.column(target))
                            out_names.append(target)
                        if g == 0:
                            arrays.append(pa.array(slot))
                            out_names.append(_SLOT)
                        out = pa.RecordBatch.from_arrays(arrays, names=out_names)
                        # One sort groups the rows by (destination, bucket); each group is one slice to spill.
                        bucket = destination_of * stride + slot // bucket_rows
                        order = np.argsort(bucket, kind="stable")
                        out = out.take(pa.array(order))
                        keys, starts = np.unique(bucket[order], return_index=True)
                        ends = list(starts[1:]) + [n]
                        for key, start, end in zip(keys.tolist(), starts.tolist(), ends):
                            where = divmod(key, stride)
                            if where not in writers:
                                path = os.path.join(spill, _spill_name(*where, g))
                                writers[where] = pa.ipc.new_stream(pa.OSFile(path, "wb"), out.schema)
                            writers[where].write_batch(out.slice(start, end - start))
                    if tallied is not None:
                        tallied.result()
                finally:
                    for writer in writers.values():
                        writer.close()
        finally:
            tallying.shutdown(wait=True)
        gate.check(source_uri)

        task = task or target_stats.task()
        if task == "classification":
            if not target_stats.integral or (target_stats.minimum is not None and target_stats.minimum < 0):
                raise ManifestError(f"classification target {target!r} must hold class indices 0..K-1")
            num_classes = int(target_stats.maximum) + 1
        else:
            num_classes = 0
        target_type = pa.int64() if task == "classification" else pa.float32()
        params = {"num_partitions": num_partitions, "batch_size": batch_size, "seed": seed,
                  "eval_fraction": eval_fraction, "row_group_rows": row_group_rows}
        data_sha = hasher.hexdigest()
        fingerprint = sha256_hex(json.dumps({"data": data_sha, "params": params, "features": features,
                                             "target": target, "task": task}, sort_keys=True).encode())
        store = destination(data_sha)
        existing = _existing_manifest(store)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise ManifestError(
                    f"{store.uri} already holds shards of other data or parameters (fingerprint "
                    f"{existing.fingerprint[:12]}…, this one {fingerprint[:12]}…); shard into a new location")
            log.info("shards at %s are already up to date (fingerprint %s); nothing rewritten", store.uri,
                     fingerprint[:12])
            return ShardResult(existing, store, reused=True)

        out_schema = pa.schema([*[(f, _stored_type(s)) for f, s in zip(features, shapes)], (target, target_type)])
        keys = [f"part-{i:05d}.parquet" for i in range(num_partitions)]
        if plan.destination_rows(num_partitions):
            keys.append("eval.parquet")

        def write(destination_index: int) -> tuple[str, int, str, tuple]:
            key = keys[destination_index]
            path = os.path.join(spill, key)
            sink = _HashingFile(path)
            rows = 0
            # No dictionary for float features: the writer would build one per column chunk and drop it once
            # it outgrew its page (3.5x the encoding time on real-valued data); zstd still squeezes repeats.
            with pq.ParquetWriter(sink, out_schema, compression="zstd", use_dictionary=[target]) as writer:
                buckets = math.ceil(plan.destination_rows(destination_index) / bucket_rows)
                for b in range(buckets):
                    columns: dict[str, pa.ChunkedArray] = {}
                    for g in range(len(groups)):  # the column groups' files of this bucket, side by side
                        bucket_path = os.path.join(spill, _spill_name(destination_index, b, g))
                        with pa.memory_map(bucket_path) as source:
                            part = pa.ipc.open_stream(source).read_all()
                        columns.update(zip(part.column_names, part.columns))
                        os.unlink(bucket_path)
                    order = pa.array(np.argsort(columns[_SLOT].to_numpy(), kind="stable"))
                    table = pa.table([columns[c] for c in out_schema.names], names=out_schema.names)
                    table = table.take(order).cast(out_schema)
                    writer.write_table(table, row_group_size=row_group_rows)
                    rows += table.num_rows
            sink.close()
            index = index_parquet_file(path)  # (size, row groups, footer): ranks stream it by these ranges
            store.put_file(key, path)
            os.unlink(path)
            return key, rows, sink.sha256.hexdigest(), index

        # As many writers as there are cores, and memory for: a container's limit, not its cores, OOM-kills it.
        workers = max(1, min(len(keys), os.cpu_count() or 1, MAX_WRITERS, available_memory() // WRITER_BYTES))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            written = list(pool.map(write, range(len(keys))))
    finally:
        shutil.rmtree(spill, ignore_errors=True)

    entries = tuple(PartitionEntry(key=key, rows=rows, sha256=sha, index=i, minibatches=plan.batches, size=size,
                                   row_groups=groups, footer=footer)
                    for i, (key, rows, sha, (size, groups, footer)) in enumerate(written[:num_partitions]))
    eval_entry = None
    if len(written) > num_partitions:
        key, rows, sha, (size, groups, footer) = written[-1]
        eval_entry = PartitionEntry(key=key, rows=rows, sha256=sha, size=size, row_groups=groups, footer=footer)
    schema_out = ShardSchema(
        features=tuple(features), target=target, task=task, num_classes=num_classes,
        # At float32 precision: training normalizes in float32, and the last float64 bits would depend on how
        # the scan was cut into batches (a memory knob), which must not change the manifest.
        feature_mean=tuple(float(np.float32(m.mean)) for m in moments),
        feature_std=tuple(float(np.float32(m.std)) for m in moments),
        columns=tuple(ColumnSpec(f, s, "float32") for f, s in zip(features, shapes))
        + (ColumnSpec(target, (), str(target_type)),))
    manifest = ShardManifest(
        fingerprint=fingerprint, source={"uri": source_uri, "sha256": data_sha, "rows": plan.rows},
        params=params, schema=schema_out, partitions=entries, eval=eval_entry, remainder_rows=plan.remainder)
    store.put_bytes(MANIFEST_NAME, manifest.to_json().encode())  # last: its presence means "complete"
    return ShardResult(manifest, store, reused=False)


def write_shards(data: "Dataset | pa.Table | pd.DataFrame", store: ObjectStore, **kwargs: Any) -> ShardManifest:
    """`shard` into one given store (the CLI, the demo, tests): partitions, eval split and (last)
    manifest.json. Same keyword arguments as `shard`."""
    return shard(data, lambda _sha: store, **kwargs).manifest


def _existing_manifest(store: ObjectStore) -> ShardManifest | None:
    try:
        return ShardManifest.from_json(store.get_bytes(MANIFEST_NAME))
    except ObjectNotFound:
        return None
    except ManifestError as exc:  # shards of an earlier ringflow, or damaged: not to be mixed with new ones
        raise ManifestError(f"{store.uri} holds shards this ringflow cannot read ({exc}); delete them, or shard "
                            f"into a new location") from None


def read_partition(store: ObjectStore, entry: PartitionEntry) -> pa.Table:
    """Read one whole partition into memory, refusing bytes that do not match the manifest (the eval split,
    which evaluation reads at once; ranks stream theirs with data.PartitionData)."""
    import io

    data = store.get_bytes(entry.key)
    entry.check(data)
    return pq.read_table(io.BytesIO(data))
