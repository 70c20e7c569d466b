"""A partition file's index for the manifest: the byte range of each Parquet row group and of the
footer, each with its sha256.

Why: a rank streams its partition from the store one row group at a time (partition_stream.py). A hash of
the whole file could only be checked after reading all of it, so a big partition would have to be copied to
local disk and hashed before the first step; a hash per range is checked as each range arrives, and the
ranks need no local disk at all.

A row group's range spans its column chunks (each from its dictionary page, if any, or its first data page,
for `total_compressed_size` bytes); ParquetWriter writes them one after the other, so they are contiguous.
The footer's range is the Thrift metadata, its length and the closing magic: the file's last bytes.
"""
from __future__ import annotations

import hashlib
import os
import struct

import pyarrow.parquet as pq

from .manifest import ByteRange, ManifestError

_MAGIC = b"PAR1"
_TAIL = 8  # the footer's length (4 bytes, little-endian) and the magic


def row_group_span(metadata: pq.FileMetaData, group: int) -> tuple[int, int]:
    """(offset, length) of row group `group`'s column chunks in the file."""
    row_group = metadata.row_group(group)
    starts, ends = [], []
    for c in range(row_group.num_columns):
        column = row_group.column(c)
        start = column.data_page_offset
        if column.has_dictionary_page and column.dictionary_page_offset is not None \
                and 0 < column.dictionary_page_offset < start:
            start = column.dictionary_page_offset
        starts.append(start)
        ends.append(start + column.total_compressed_size)
    return min(starts), max(ends) - min(starts)


def index_parquet_file(path: str) -> tuple[int, tuple[ByteRange, ...], ByteRange]:
    """(file size, row-group ranges, footer range) of the Parquet file at `path`, with their sha256."""
    size = os.path.getsize(path)
    metadata = pq.read_metadata(path)
    with open(path, "rb") as fh:
        fh.seek(size - _TAIL)
        tail = fh.read(_TAIL)
        if tail[4:] != _MAGIC:
            raise ManifestError(f"{path} is not a Parquet file (no closing magic)")
        footer_offset = size - _TAIL - struct.unpack("<I", tail[:4])[0]
        groups = []
        previous_end = 0
        for g in range(metadata.num_row_groups):
            offset, length = row_group_span(metadata, g)
            if offset < previous_end:
                raise ManifestError(f"{path}: row group {g} overlaps the one before; cannot index it")
            previous_end = offset + length
            groups.append(ByteRange(offset, length, _hash_range(fh, offset, length),
                                    rows=metadata.row_group(g).num_rows))
        footer = ByteRange(footer_offset, size - footer_offset, _hash_range(fh, footer_offset, size - footer_offset))
    return size, tuple(groups), footer


def _hash_range(fh, offset: int, length: int) -> str:
    digest = hashlib.sha256()
    fh.seek(offset)
    left = length
    while left:
        chunk = fh.read(min(left, 1 << 20))
        if not chunk:
            raise ManifestError(f"{fh.name} ended inside the range [{offset}, {offset + length})")
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest()
