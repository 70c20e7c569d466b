"""A rank's partition as a source of Parquet row groups, streamed from the store by byte ranges (the manifest
entry's index, partition_index.py): the footer once, when opened, then each row group when asked, each range
checked against its sha256 as it arrives; nothing on local disk. data.PartitionData reads windows of row
groups from it on its loader thread.
"""
from __future__ import annotations

import io
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..formats.manifest import ManifestError, PartitionEntry
from ..formats.partition_index import row_group_span
from ..store.base import ObjectStore, Progress

# How a source reports what it read: the bytes moved (store_ops.StoreOp.moved), or None.
Moved = Progress | None


class StreamedPartition:
    """Row groups of one partition file, by number, read from the store a row group at a time: the footer
    once, when opened, then each row group's byte range when asked, checked against the manifest before
    Parquet decodes a byte of it."""

    def __init__(self, store: ObjectStore, entry: PartitionEntry, moved: Moved = None):
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

    def fetch(self, group: int, moved: Moved = None) -> bytes:
        """Row group `group`'s bytes (one ranged read), checked against the manifest: safe from several
        threads at once, so a window's row groups can be in flight together."""
        listed = self._entry.row_groups[group]
        data = self._store.get_range(self.key, listed.offset, listed.length, progress=moved)
        listed.check(data, f"row group {group} of partition {self.key!r}")
        return data

    def table(self, fetched: dict[int, bytes], columns: Sequence[str]) -> pa.Table:
        """The row groups fetched (group -> its bytes, from fetch), decoded, in the mapping's order."""
        segments = {self._entry.footer.offset: self._footer}
        segments.update((self._entry.row_groups[g].offset, data) for g, data in fetched.items())
        # No pre-buffering: it coalesces column chunks across small holes, reading bytes that were not fetched.
        reader = pq.ParquetFile(_SparseFile(self._entry.size, segments), metadata=self.metadata, pre_buffer=False)
        return reader.read_row_groups(list(fetched), columns=list(columns))


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
