"""Check that the shards on the store are the bytes the manifest describes, before any rank starts.

A shard changed after sharding (overwritten, truncated, a partial copy) would otherwise be found only by the
ranks, as tracebacks in the job log. By default the check costs next to nothing whatever the shards' size:
each file's size (a stat: a truncated or partly copied file), and the sha256 of each file's Parquet footer
(one small range read: the footer holds every row group's offsets and statistics, so a file rewritten with
other rows is caught even at the same size). The ranks still verify every row group against the manifest as
they stream it. `full=True` (`ringflow train --verify-shards`) also reads every row group before launch, one
at a time: memory stays one row group, but it reads the whole dataset once more, so it is not the default: a
40 GB table behind a slow link would wait that long before training started.
"""
from __future__ import annotations

import hashlib

from ..formats.manifest import ManifestError, PartitionEntry, ShardManifest
from ..store.base import ObjectNotFound, ObjectStore


class ShardChanged(ManifestError):
    """A shard is missing or is not the bytes its manifest describes; re-run the shard step."""


def _changed(entry: PartitionEntry, what: str) -> ShardChanged:
    return ShardChanged(f"shard {entry.key!r} {what}: it was changed after sharding")


def verify_shards(manifest: ShardManifest, store: ObjectStore, full: bool = False) -> None:
    """Raise ShardChanged unless every partition (and the eval split) is on `store` as the manifest says:
    sizes and footers, and with `full` every byte."""
    entries = [*manifest.partitions, *([manifest.eval] if manifest.eval is not None else [])]
    for entry in entries:  # sizes first: cheap, and what a truncated copy gets wrong
        try:
            size = store.stat(entry.key).size
        except ObjectNotFound:
            raise _changed(entry, "does not exist") from None
        if size != entry.size:
            raise _changed(entry, f"has {size} bytes, the manifest says {entry.size}")
    for entry in entries:
        for byte_range in ((*entry.row_groups, entry.footer) if full else (entry.footer,)):
            data = store.get_range(entry.key, byte_range.offset, byte_range.length)
            if hashlib.sha256(data).hexdigest() != byte_range.sha256:
                raise _changed(entry, f"fails its checksum at bytes {byte_range.offset}.."
                                      f"{byte_range.offset + byte_range.length}")
