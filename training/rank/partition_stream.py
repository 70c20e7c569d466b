"""A rank's partition as a source of Parquet row groups, streamed from the store by byte ranges (the manifest
entry's index, partition_index.py): the footer once, when opened, then each row group when asked, each range
checked against its sha256 as it arrives; nothing on local disk. data.PartitionData reads windows of row
groups from it on its loader thread.
"""
from __future__ import annotations

import mmap
import sys
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..formats.manifest import ManifestError, PartitionEntry
from ..formats.partition_index import row_group_span
from ..store.base import ObjectStore, Progress
from .host_ranges import HostRanges

# How a source reports what it read: the bytes moved (store_ops.StoreOp.moved), or None.
Moved = Progress | None


class StreamedPartition:
    """Row groups of one partition file, by number, read from the store a row group at a time: the footer
    once, when opened, then each row group's byte range when asked, checked against the manifest before
    Parquet decodes a byte of it.

    host_ranges: the ranges kept on this host (an elastic DDP job's, host_ranges.py), read from there when a
    rank kept them; `footer` is then the footer's bytes, for the reader to keep again."""

    def __init__(self, store: ObjectStore, entry: PartitionEntry, moved: Moved = None,
                 host_ranges: HostRanges | None = None):
        self._store, self._entry, self._host_ranges = store, entry, host_ranges
        self.key, self.store_uri = entry.key, store.uri
        footer = host_ranges.get(entry.footer) if host_ranges is not None else None
        if footer is None:
            footer = store.get_range(entry.key, entry.footer.offset, entry.footer.length, progress=moved)
            entry.footer.check(footer, f"the footer of partition {entry.key!r}")
        self.footer = footer if host_ranges is not None else None
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
        """Row group `group`'s bytes (one ranged read, or the host's kept copy), checked against the manifest:
        safe from several threads at once, so a window's row groups can be in flight together."""
        listed = self._entry.row_groups[group]
        if self._host_ranges is not None and (kept := self._host_ranges.get(listed)) is not None:
            return kept
        data = self._store.get_range(self.key, listed.offset, listed.length, progress=moved)
        listed.check(data, f"row group {group} of partition {self.key!r}")
        return data

    def table(self, fetched: dict[int, bytes], columns: Sequence[str]) -> pa.Table:
        """The row groups fetched (group -> its bytes, from fetch), decoded, in the mapping's order. Parquet
        reads them from an image of the file in memory (file_image), so its reads never call into Python."""
        image = file_image(self._entry.size, {self._entry.row_groups[g].offset: data for g, data in fetched.items()},
                           self.key)
        # No pre-buffering: it coalesces column chunks across small holes, reading bytes that were not fetched.
        reader = pq.ParquetFile(pa.BufferReader(image), metadata=self.metadata, pre_buffer=False)
        return reader.read_row_groups(list(fetched), columns=list(columns))


# Linux's MAP_NORESERVE (the same value on x86-64 and arm64), which Python's mmap module does not name: the
# image's address space is not charged against the kernel's overcommit limit, only the pages written are.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" else 0)


def file_image(size: int, segments: dict[int, bytes], key: str) -> pa.Buffer:
    """A file of `size` bytes in memory holding `segments` (offset -> bytes) at their offsets: what pyarrow's
    Parquet reader decodes the fetched row groups from. An anonymous private mapping, so only the segments'
    pages are ever committed, however large the file. Read natively: a Python file object instead (read()
    called for every column chunk, 128 times a row group here) takes the GIL away from the training thread on
    each call, which cost a 2-rank job on 2 cores a fifth of its samples/s (bench/results/stream_profile.md).
    Parquet reads nothing outside the segments: the metadata's column chunks of a row group lie inside the
    span the manifest lists for it (checked when the partition is opened), which is what fetch reads."""
    try:
        image = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except OSError as exc:
        raise MemoryError(f"could not map {size} bytes of address space to decode row groups of partition "
                          f"{key!r} ({exc.strerror}): the host refuses large mappings (vm.overcommit_memory=2); "
                          "shard into more, smaller partitions") from exc
    for offset, data in segments.items():
        image[offset:offset + len(data)] = data
    return pa.py_buffer(image)
