"""A user script's share of the sharded dataset (training/api.py's `get_dataset_shard`): the same global stream,
order and cursor as ringflow's own loop (partition_batches.py, stream_deal.py), so a script that trains on it
resumes sample-exact from a checkpoint, on any number of workers. Torch-free: torch tensors only when asked for.

    shard = ringflow.get_dataset_shard()
    for epoch in shard.epochs():          # from the resumed epoch to the config's `epochs`
        for x, y in shard:                # this rank's batches of the epoch, from the resumed position on
            ...
            ringflow.report({"loss": loss.item()}, checkpoint=...)   # saves the position after this batch

Every rank takes the same number of batches each epoch (collectives stay in step); the last one of an epoch may
be smaller, and where the deal is uneven by one row a rank's last batch can hold no rows at all.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from ..formats.manifest import ShardManifest
from ..health.progress import Progress
from ..store import ObjectStore
from .partition_batches import Cursor, PartitionBatches

FORMATS = ("torch", "numpy", "tensorflow")


def default_format() -> str:
    """torch where torch is installed (the torch engines' images), else numpy (the TensorFlow venv)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "numpy"
    return "torch"


def open_batches(store: ObjectStore, manifest: ShardManifest, rank: int, world_size: int, batch_size: int,
                 fmt: str, progress: Progress) -> PartitionBatches:
    """This rank's reader of the stream, serving numpy arrays or torch tensors (on the CPU)."""
    if fmt == "torch":
        from .data import PartitionData

        return PartitionData(store, manifest, rank, world_size, batch_size, progress=progress)
    return PartitionBatches(store, manifest, rank, world_size, batch_size, progress=progress)


class DatasetShard:
    """This rank's batches, epoch by epoch, from `cursor` on; `cursor` always names the position after the
    last batch served (what a checkpoint taken now resumes from)."""

    def __init__(self, batches: PartitionBatches, seed: int, epochs: int, cursor: Cursor, fmt: str,
                 on_batch: Callable[[], None] = lambda: None):
        self._batches, self._seed, self._epochs, self._fmt = batches, seed, epochs, fmt
        self.cursor = cursor
        self._on_batch = on_batch
        self.served_empty = False  # whether the batch served last held no rows

    @property
    def rows(self) -> int:
        """This rank's rows of a whole epoch."""
        return self._batches.rows

    @property
    def batches_per_epoch(self) -> int:
        return self._batches.batches_per_epoch

    @property
    def row_ids(self):
        """The (file index in the manifest, row in that file) of each row of the batch last served: a numpy
        int64 array of shape (rows, 2), the same ids whatever the epoch or world size (none for an empty batch)."""
        return self._batches.row_ids

    @property
    def schema(self):
        """The manifest's schema: features, target, input_shape, num_outputs, task."""
        return self._batches.schema

    def epochs(self) -> Iterator[int]:
        """The epochs left to train, from the cursor's; after each, the cursor moves to the next epoch's start."""
        while self.cursor.epoch < self._epochs:
            epoch = self.cursor.epoch
            yield epoch
            if self.cursor.epoch == epoch:  # the script left its epoch early: the next epoch starts anew
                self.cursor = Cursor(epoch + 1)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        start = self.cursor
        for index, x, y in self._batches.batches(self._seed, start):
            self.cursor = Cursor(start.epoch, index + 1, start.remaining)
            self.served_empty = len(y) == 0
            self._on_batch()
            yield self._convert(x), self._convert(y)
        self.cursor = Cursor(start.epoch + 1)

    def _convert(self, value: Any) -> Any:
        if self._fmt == "tensorflow":
            import tensorflow as tf

            return tf.convert_to_tensor(value)
        return value

    def settled(self) -> Cursor:
        """The cursor as any world size can deal it (its epoch's unseen rows), for a checkpoint."""
        return self._batches.settled(self.cursor)
