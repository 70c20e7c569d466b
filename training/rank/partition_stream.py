"""A rank's partition as a source of Parquet row groups: streamed from the store by byte ranges (a v3
manifest entry: each range checked against its sha256 as it arrives, nothing on local disk), or, for an
entry without an index (v1/v2 manifests), the whole file checked by its sha256 first (the store's own file
for a local folder, else a download into a temporary folder).

`open_partition` picks one; data.PartitionData reads windows of row groups from it on its loader thread.
"""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..formats.manifest import ManifestError, PartitionEntry
from ..formats.partition_index import row_group_span
from ..store.base import ObjectStore, Progress

# How a source reports what it read: the bytes moved (store_ops.StoreOp.moved), or None.
Moved = Progress | None


class PartitionSource:
    """Row groups of one partition file, by number."""

    key: str
    store_uri: str
    group_rows: list[int]

    def group_bytes(self, groups: Sequence[int]) -> int | None:
        """How many bytes reading `groups` moves from the store (None: unknown)."""
        return None

    def read(self, groups: Sequence[int], columns: Sequence[str], moved: Moved = None) -> pa.Table:
        raise NotImplementedError

    def read_all(self, columns: Sequence[str], moved: Moved = None) -> pa.Table:
        return self.read(range(len(self.group_rows)), columns, moved)

    def close(self) -> None:
        """Release what opening it took (a downloaded copy)."""


class StreamedPartition(PartitionSource):
    """A v3 partition read from the store a row group at a time: the footer once, when opened, then each
    row group's byte range when asked, checked against the manifest before Parquet decodes a byte of it."""

    def __init__(self, store: ObjectStore, entry: PartitionEntry, moved: Moved = None):
        if not entry.indexed:
            raise ValueError(f"partition {entry.key!r} has no row-group index (a v1/v2 manifest)")
        self._store, self._entry = store, entry
        self.key, self.store_uri = entry.key, store.uri
        footer = store.get_range(entry.key, entry.footer.offset, entry.footer.length, progress=moved)
        entry.footer.check(footer, f"the footer of partition {entry.key!r}")
        self._footer = footer
        # The footer alone, behind a leading magic, parses as the file's metadata (offsets into the real file).
        self.metadata = pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
        if self.metadata.num_row_groups != len(entry.row_groups):
            raise ManifestError(f"partition {entry.key!r} has {self.metadata.num_row_groups} row groups, the "
                                f"manifest lists {len(entry.row_groups)}: re-run the shard step")
        for g, listed in enumerate(entry.row_groups):
            if row_group_span(self.metadata, g) != (listed.offset, listed.length):
                raise ManifestError(f"partition {entry.key!r}: row group {g} is not where the manifest says; "
                                    f"re-run the shard step")
        self.group_rows = [self.metadata.row_group(g).num_rows for g in range(self.metadata.num_row_groups)]

    def group_bytes(self, groups: Sequence[int]) -> int:
        return sum(self._entry.row_groups[g].length for g in groups)

    def read(self, groups: Sequence[int], columns: Sequence[str], moved: Moved = None) -> pa.Table:
        groups = list(groups)
        segments = {self._entry.footer.offset: self._footer}
        for g in groups:
            listed = self._entry.row_groups[g]
            data = self._store.get_range(self.key, listed.offset, listed.length, progress=moved)
            listed.check(data, f"row group {g} of partition {self.key!r}")
            segments[listed.offset] = data
        # No pre-buffering: it coalesces column chunks across small holes, reading bytes that were not fetched.
        reader = pq.ParquetFile(_SparseFile(self._entry.size, segments), metadata=self.metadata, pre_buffer=False)
        return reader.read_row_groups(groups, columns=list(columns))


class WholePartition(PartitionSource):
    """An entry without an index: the whole file on this machine, its sha256 checked before any read."""

    def __init__(self, store: ObjectStore, entry: PartitionEntry, moved: Moved = None,
                 on_verify: Callable[[], None] = lambda: None):
        """moved: gets the bytes downloaded, then the bytes hashed; on_verify: called between the two."""
        from ..store import LocalFolderStore

        self.key, self.store_uri = entry.key, store.uri
        self._tmp = None
        if isinstance(store, LocalFolderStore):
            path = str(store.root / entry.key)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="ringflow-partition-")
            path = os.path.join(self._tmp.name, os.path.basename(entry.key))
            store.get_file(entry.key, path, progress=moved)
        on_verify()
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
                if moved is not None:
                    moved(len(chunk))  # hashing a big file is progress too
        actual = digest.hexdigest()
        if actual != entry.sha256:
            raise ManifestError(
                f"partition {entry.key!r} fails its checksum (manifest sha256 {entry.sha256[:12]}…, "
                f"file {actual[:12]}…): the shard was changed after sharding; re-run the shard step")
        self.path = path
        self.file = pq.ParquetFile(path)
        self.group_rows = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]

    def read(self, groups: Sequence[int], columns: Sequence[str], moved: Moved = None) -> pa.Table:
        return self.file.read_row_groups(list(groups), columns=list(columns))

    def read_all(self, columns: Sequence[str], moved: Moved = None) -> pa.Table:
        return self.file.read(columns=list(columns))

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def open_partition(store: ObjectStore, entry: PartitionEntry, moved: Moved = None,
                   on_verify: Callable[[], None] = lambda: None) -> PartitionSource:
    if entry.indexed:
        return StreamedPartition(store, entry, moved)
    return WholePartition(store, entry, moved, on_verify)


class _SparseFile(io.RawIOBase):
    """A file of `size` bytes of which only some ranges are here (the footer, the row groups being read):
    what pyarrow's Parquet reader is given, so it decodes from memory what the ranged reads fetched. A read
    outside them is a bug in the index, and fails loudly rather than returning zeros."""

    def __init__(self, size: int, segments: dict[int, bytes]):
        super().__init__()
        self._size = size
        self._segments = sorted(segments.items())
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self._size - self._pos
        size = min(size, self._size - self._pos)
        if size <= 0:
            return b""
        # Parquet may coalesce the column chunks of adjacent row groups into one read: join the segments.
        parts, at, end = [], self._pos, self._pos + size
        for start, data in self._segments:
            if start <= at < start + len(data):
                take = data[at - start:min(end, start + len(data)) - start]
                parts.append(take)
                at += len(take)
                if at == end:
                    self._pos = end
                    return b"".join(parts)
        raise OSError(f"bytes [{at}, {end}) of the partition were not fetched "
                      f"(fetched: {[(s, s + len(d)) for s, d in self._segments]})")

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)
