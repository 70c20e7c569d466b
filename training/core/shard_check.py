"""Check that the shards on the store are the bytes the manifest describes, before any rank starts.

A shard changed after sharding (overwritten, truncated, a partial copy) would otherwise be found only by the
ranks, as tracebacks in the job log. Sizes first (one listing-level stat each: a truncated or replaced file
is found without reading it), then every byte range's sha256 (a v3 manifest's row groups and footer; an
older manifest's whole file), read a range at a time: memory stays one row group (or CHUNK_BYTES) whatever
the shards' size.
"""
from __future__ import annotations

import hashlib

from ringflow.training.manifest import ManifestError, PartitionEntry, ShardManifest
from ringflow.training.store.base import ObjectNotFound, ObjectStore

# How much of a file without a byte-range index is read at a time.
CHUNK_BYTES = 8 * 2**20


class ShardChanged(ManifestError):
    """A shard is missing or is not the bytes its manifest describes; re-run the shard step."""


def _changed(entry: PartitionEntry, what: str) -> ShardChanged:
    return ShardChanged(f"shard {entry.key!r} {what}: it was changed after sharding")


def verify_shards(manifest: ShardManifest, store: ObjectStore) -> None:
    """Raise ShardChanged unless every partition (and the eval split) is on `store` as the manifest says."""
    entries = [*manifest.partitions, *([manifest.eval] if manifest.eval is not None else [])]
    for entry in entries:  # sizes first: cheap, and what a truncated copy gets wrong
        try:
            size = store.stat(entry.key).size
        except ObjectNotFound:
            raise _changed(entry, "does not exist") from None
        if entry.size and size != entry.size:
            raise _changed(entry, f"has {size} bytes, the manifest says {entry.size}")
    for entry in entries:
        if entry.indexed:
            for byte_range in (*entry.row_groups, entry.footer):
                data = store.get_range(entry.key, byte_range.offset, byte_range.length)
                if hashlib.sha256(data).hexdigest() != byte_range.sha256:
                    raise _changed(entry, f"fails its checksum at bytes {byte_range.offset}.."
                                          f"{byte_range.offset + byte_range.length}")
            continue
        digest, offset, size = hashlib.sha256(), 0, store.stat(entry.key).size
        while offset < size:
            chunk = store.get_range(entry.key, offset, min(CHUNK_BYTES, size - offset))
            digest.update(chunk)
            offset += len(chunk)
        if digest.hexdigest() != entry.sha256:
            raise _changed(entry, "fails its checksum")
