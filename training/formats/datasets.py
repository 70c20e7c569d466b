"""The one dataset reader of validate, shard and the CLI: a dataset is a `pyarrow.dataset` read as a stream of
record batches, so no step holds a whole table in memory. Also the one content fingerprint ("same data"), the
shape and dtype of tensor-valued columns, and the small real datasets that ship inside registry packages.

A dataset URI is `builtin:<name>`, or a Parquet/CSV file as a path, file:// or s3:// URI. Local files are
scanned where they lie; an object in S3 is first downloaded to a temporary file (disk, not memory), because
the store's client carries ringflow's retries and credentials and Arrow's own S3 client would need both again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import tempfile
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from .tensor_columns import column_shape, row_bytes, tensor_values

BUILTIN = ("digits", "diabetes", "wine", "digits_images")
# About this many bytes of rows per record batch: what bounds the memory of every streaming step.
BATCH_BYTES = 8 * 2**20
# What the column readers of one pass over a Parquet file may hold together. A reader keeps, per column, its
# current pages (a dictionary page and a data page, compressed and decoded), whatever the batch size, so a
# wide table is read in column groups, one pass each (Dataset.column_groups).
READ_BYTES = 96 * 2**20
# One column's reader holds at most its whole column chunk, compressed and decoded; a large chunk is read
# page by page, and its pages stay within this (measured: 1.2 MiB per column of 65,536-row chunks, 3.6 MiB of
# 250,000-row dictionary-encoded ones, 6.4 MiB of 1 M-row ones; writers' page limits are about 1 MiB).
COLUMN_READ_BYTES = 6 * 2**20
# Column chunks are read through a buffer of this size: Arrow's default reads each chunk whole, so memory
# would grow with the input's row groups.
READ_BUFFER_BYTES = 2**16
MIN_BATCH_ROWS, MAX_BATCH_ROWS = 256, 1 << 20
# The shape of the digits images (channels, height, width).
DIGITS_IMAGE_SHAPE = (1, 8, 8)


class DatasetError(ValueError):
    """A dataset that cannot be read as a table: the message names the file, the problem and the fix."""


def load_builtin(name: str) -> pd.DataFrame:
    """scikit-learn's bundled tabular datasets as one table: feature columns plus `target`."""
    from sklearn import datasets

    loaders = {"digits": datasets.load_digits, "diabetes": datasets.load_diabetes, "wine": datasets.load_wine}
    if name not in loaders:
        raise DatasetError(f"unknown built-in dataset {name!r}; use one of {BUILTIN}")
    frame = loaders[name](as_frame=True).frame
    frame.columns = [str(c).replace(" ", "_") for c in frame.columns]
    return frame


def builtin_table(name: str) -> pa.Table:
    """A built-in dataset as an Arrow table; `digits_images` is digits with the 64 pixels as one 1x8x8
    tensor column `image` (Arrow's fixed_shape_tensor) and `target`."""
    if name == "digits_images":
        from sklearn import datasets

        bunch = datasets.load_digits()
        images = bunch.images.astype(np.float32).reshape(-1, *DIGITS_IMAGE_SHAPE)
        return pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
                         "target": pa.array(bunch.target.astype(np.int64))})
    return pa.Table.from_pandas(load_builtin(name), preserve_index=False)


def check_table_name(uri: str) -> None:
    """Fail before any read when a dataset file is neither Parquet nor CSV."""
    if not uri.endswith((".parquet", ".csv")):
        raise DatasetError(f"dataset {uri!r}: use a .parquet or .csv file, or builtin:<name>")


def rows_per_batch(schema: pa.Schema, budget: int | None = None) -> int:
    """Rows of a record batch of about `budget` (default BATCH_BYTES) bytes."""
    budget = BATCH_BYTES if budget is None else budget
    return int(min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, budget // row_bytes(schema))))


# -- the reader ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset opened for streaming. `batches()` yields record batches of about BATCH_BYTES."""

    uri: str
    arrow: ds.Dataset

    @property
    def schema(self) -> pa.Schema:
        return self.arrow.schema

    @property
    def columns(self) -> list[str]:
        return list(self.arrow.schema.names)

    @functools.cached_property
    def num_rows(self) -> int:
        # Parquet: from the footers, nothing decoded. CSV: one streaming pass.
        return self.arrow.count_rows()

    def batches(self, columns: Sequence[str] | None = None, batch_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """Record batches of at most `batch_rows` (default: about BATCH_BYTES) rows, in file order.

        Parquet is read in slices of rows whatever its row groups (a batch may span two), each column chunk
        through a small buffer, and nothing ahead but the next batch: Arrow's dataset scanner and
        pre-buffering read ahead of a slow consumer (the shard step), so their memory grew with the data
        (bench/data_scaling.py), and whole row groups made it grow with the input's row-group size
        (bench/data_memory.py). CSV is read block by block."""
        names = list(columns) if columns is not None else self.columns
        schema = pa.schema([self.schema.field(c) for c in names])
        size = batch_rows or rows_per_batch(schema)
        if not isinstance(self.arrow, ds.FileSystemDataset):  # in memory already
            yield from self.arrow.to_batches(columns=names, batch_size=size)
            return
        import pyarrow.csv as pv
        import pyarrow.parquet as pq

        filesystem = self.arrow.filesystem
        for path in self.arrow.files:
            with filesystem.open_input_file(path) as source:
                if self._is_parquet:
                    try:
                        parquet = pq.ParquetFile(source, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)
                        yield from _one_ahead(parquet.iter_batches(batch_size=size, columns=names, use_threads=False))
                    except (pa.ArrowInvalid, OSError) as exc:  # a row group cut short or overwritten
                        raise unreadable(path, "Parquet", exc) from exc
                    continue
                try:
                    reader = pv.open_csv(source, read_options=pv.ReadOptions(
                                             block_size=max(1 << 20, size * row_bytes(schema)), use_threads=False),
                                         convert_options=pv.ConvertOptions(column_types=schema, include_columns=names))
                    for batch in reader:  # a CSV block may hold more rows than asked for
                        for start in range(0, batch.num_rows, size):
                            yield batch.slice(start, size)
                except pa.ArrowInvalid as exc:
                    raise csv_type_error(path, self.columns, schema, exc) from exc

    @property
    def _is_parquet(self) -> bool:
        return isinstance(self.arrow, ds.FileSystemDataset) and isinstance(self.arrow.format, ds.ParquetFileFormat)

    def column_groups(self, columns: Sequence[str] | None = None,
                      together: Iterable[Iterable[str]] = ()) -> list[list[str]]:
        """`columns` (default: all) in groups to read one pass each (`batches(group)`), so that one pass's
        column readers hold about READ_BYTES at most: a narrow table is one group, a wide one several. The
        columns of one set in `together` (say, an expectation comparing them row by row) share a group.
        CSV and in-memory data are one group: a CSV is parsed whole whichever columns are kept."""
        names = list(columns) if columns is not None else self.columns
        if not self._is_parquet:
            return [names] if names else []
        return column_groups(names, self._column_read_bytes, READ_BYTES, together)

    @functools.cached_property
    def _column_read_bytes(self) -> dict[str, int]:
        """What streaming each column costs its reader at most, from the Parquet footers (the largest of its
        chunks, over every row group of every file)."""
        cost: dict[str, int] = {}
        for fragment in self.arrow.get_fragments():
            metadata = fragment.metadata
            leaves = [field.name for field in metadata.schema.to_arrow_schema()
                      for _ in range(_leaf_count(field.type))]
            for g in range(metadata.num_row_groups):
                group = metadata.row_group(g)
                in_group: dict[str, int] = {}
                for i, name in enumerate(leaves):
                    chunk = group.column(i)
                    in_group[name] = in_group.get(name, 0) + min(
                        chunk.total_compressed_size + chunk.total_uncompressed_size, COLUMN_READ_BYTES)
                for name, bytes_ in in_group.items():
                    cost[name] = max(cost.get(name, 0), bytes_)
        return cost


def column_groups(columns: Sequence[str], read_bytes: Mapping[str, int], budget: int,
                  together: Iterable[Iterable[str]] = ()) -> list[list[str]]:
    """Consecutive runs of `columns` whose `read_bytes` add up to `budget` at most (a column over budget on
    its own is a group), keeping each set in `together` in one group (placed with its first column)."""
    position = {c: i for i, c in enumerate(columns)}
    units: dict[int, list[str]] = {i: [c] for i, c in enumerate(columns)}  # by the position of the first column
    home = dict(position)  # column -> key of its unit
    for joined in together:
        keys = sorted({home[c] for c in joined if c in home})
        for key in keys[1:]:
            for c in units.pop(key):
                units[keys[0]].append(c)
                home[c] = keys[0]
    groups: list[list[str]] = []
    used = budget + 1
    for key in sorted(units):
        cost = sum(read_bytes.get(c, 0) for c in units[key])
        if groups and used + cost <= budget:
            groups[-1].extend(units[key])
            used += cost
        else:
            groups.append(list(units[key]))
            used = cost
    return [sorted(group, key=position.__getitem__) for group in groups]


def _leaf_count(type_: pa.DataType) -> int:
    """How many Parquet column chunks (leaves) an Arrow type is stored as."""
    if isinstance(type_, pa.BaseExtensionType):
        return _leaf_count(type_.storage_type)
    if pa.types.is_struct(type_):
        return sum(_leaf_count(type_.field(i).type) for i in range(type_.num_fields))
    if pa.types.is_map(type_):
        return _leaf_count(type_.key_type) + _leaf_count(type_.item_type)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_) \
            or pa.types.is_list_view(type_) or pa.types.is_large_list_view(type_):
        return _leaf_count(type_.value_type)
    return 1


_CSV_COLUMN = re.compile(r"In CSV column #(\d+): ")


def unreadable(path: str, kind: str, exc: Exception) -> DatasetError:
    """A file that is not a readable table of its kind (truncated, or not that format at all)."""
    text = " ".join(str(exc).split())
    reason = text.rsplit(": ", 1)[-1] if text else type(exc).__name__  # Arrow's innermost cause
    return DatasetError(f"dataset {path} is not a readable {kind} file ({reason}); it is truncated or not {kind}: "
                        f"export it again, or copy it again if the copy was cut short")


def csv_type_error(path: str, file_columns: Sequence[str], schema: pa.Schema, exc: Exception) -> DatasetError:
    """A clear error for a CSV value that does not fit the type its column was given from the file's first
    rows (Arrow infers the schema from the first block, then converts every block to it)."""
    message = str(exc)
    match = _CSV_COLUMN.match(message)
    column = file_columns[int(match.group(1))] if match and int(match.group(1)) < len(file_columns) else None
    where = f"column {column!r} ({schema.field(column).type} from the first rows)" if column in schema.names else \
        "a column"
    return DatasetError(f"dataset {path}: {where} holds a value of another type further down: "
                      f"{message.split(': ', 1)[-1] if match else message}; fix that value, or convert the file "
                      "to Parquet with explicit column types")


def _one_ahead(items: Iterator[Any]) -> Iterator[Any]:
    """`items`, with the next one produced in a thread while the caller works on this one: Parquet decoding
    releases the GIL, so reading overlaps the consumer's work. Holds one item more."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringflow-read") as pool:
        iterator = iter(items)
        pending = pool.submit(next, iterator, None)
        while True:
            item = pending.result()
            if item is None:
                return
            pending = pool.submit(next, iterator, None)
            yield item


def as_dataset(data: "Dataset | ds.Dataset | pa.Table | pd.DataFrame", uri: str = "") -> Dataset:
    """A Dataset over something already opened or in memory (tests, the demo, built-ins)."""
    if isinstance(data, Dataset):
        return data
    if isinstance(data, pd.DataFrame):
        data = pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, pa.Table):
        data = ds.dataset(data)
    return Dataset(uri=uri, arrow=data)


def _file_dataset(path: str, uri: str) -> Dataset:
    fmt = "parquet" if uri.endswith(".parquet") else "csv"
    try:
        return Dataset(uri=uri, arrow=ds.dataset(path, format=fmt))
    except (pa.ArrowInvalid, OSError) as exc:  # no footer (cut short), or not the format its name says
        raise unreadable(uri, "Parquet" if fmt == "parquet" else "CSV", exc) from exc


@contextlib.contextmanager
def open_dataset(uri: str, open_store: Callable[[str], Any] | None = None) -> Iterator[Dataset]:
    """Open `uri` for streaming. `open_store(parent_uri)` gives the store a file lives in (default: S3
    settings from the environment; operators pass their Airflow connection's)."""
    if uri.startswith("builtin:"):
        name = uri.split(":", 1)[1]
        if name not in BUILTIN:
            raise DatasetError(f"unknown built-in dataset {name!r}; use one of {BUILTIN}")
        yield as_dataset(builtin_table(name), uri)
        return
    from ..store import LocalFolderStore, open_store as default_open, split_uri

    check_table_name(uri)
    parent, name = split_uri(uri)
    store = (open_store or default_open)(parent)
    if isinstance(store, LocalFolderStore):
        path = store.root / name
        if not path.is_file():
            from ..store import ObjectNotFound
            raise ObjectNotFound(f"dataset {uri!r} does not exist")
        yield _file_dataset(str(path), uri)
        return
    with tempfile.TemporaryDirectory(prefix="ringflow-dataset-") as tmp:
        path = os.path.join(tmp, os.path.basename(name))
        store.get_file(name, path)
        yield _file_dataset(path, uri)


# -- the content fingerprint ---------------------------------------------------------------------------

class ContentHash:
    """sha256 of a table's content, fed one record batch at a time: the one meaning of "same data".

    Independent of how the table is cut into batches and of how it is stored (Parquet row groups,
    compression, file names); it changes with any value, any column name or type, or the row order. Each
    column is hashed on its own stream (validity, then values), so batch boundaries never show, and a batch
    may hold any of the columns: a wide table can be fed one column group at a time (Dataset.column_groups).
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._index = {name: i for i, name in enumerate(schema.names)}
        self._rows = [0] * len(schema)
        self._valid = [hashlib.sha256() for _ in schema]
        self._values = [hashlib.sha256() for _ in schema]

    def update(self, batch: pa.RecordBatch) -> None:
        for name, column in zip(batch.schema.names, batch.columns):
            i = self._index[name]
            self._rows[i] += len(column)
            if column.null_count:
                self._valid[i].update(np.asarray(pc.is_valid(column)).view(np.uint8).tobytes())
            else:  # the same bytes as above without materializing them
                self._valid[i].update(b"\x01" * len(column))
            self._values[i].update(_value_bytes(column))

    @property
    def rows(self) -> int:
        return self._rows[0] if self._rows else 0

    def hexdigest(self) -> str:
        if len(set(self._rows)) > 1:
            fed = dict(zip(self.schema.names, self._rows))
            raise ValueError(f"the columns were fed different numbers of rows ({fed}); feed every column every row once")
        head = json.dumps({"columns": [[f.name, str(f.type)] for f in self.schema], "rows": self.rows})
        digest = hashlib.sha256(head.encode())
        for valid, values in zip(self._valid, self._values):
            digest.update(valid.digest() + values.digest())
        return digest.hexdigest()


def _value_bytes(column: pa.Array) -> bytes:
    shape, element = column_shape(column.type)
    if shape and -1 not in shape:
        column = tensor_values(column)
    if pa.types.is_primitive(column.type):
        if column.null_count:
            column = column.fill_null(False if pa.types.is_boolean(column.type) else 0)
        return column.to_numpy(zero_copy_only=False).tobytes()
    # Strings, variable lists, anything else: pandas' per-row hash, which does not depend on batches either.
    values = column.to_pandas()
    try:
        return pd.util.hash_pandas_object(values, index=False).to_numpy().tobytes()
    except TypeError:  # unhashable values (variable-length lists): their text
        return pd.util.hash_pandas_object(values.astype(str), index=False).to_numpy().tobytes()


def fingerprint(dataset: Dataset) -> str:
    """The content fingerprint of a whole dataset, in one streaming pass."""
    hasher = ContentHash(dataset.schema)
    for batch in dataset.batches():
        hasher.update(batch)
    return hasher.hexdigest()
