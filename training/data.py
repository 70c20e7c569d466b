"""A rank's view of its partition: tensors in memory and a deterministic, resumable batch order."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ringflow.training.manifest import ShardManifest, ShardSchema
from ringflow.training.sharding import read_partition
from ringflow.training.store.base import ObjectStore


@dataclasses.dataclass(frozen=True)
class Cursor:
    """Where training stands: the next minibatch to take is `batch` of `epoch`.

    Saved in every checkpoint; a resumed run continues at exactly this minibatch, so no sample is seen
    twice or skipped within an epoch.
    """

    epoch: int = 0
    batch: int = 0


def epoch_order(num_rows: int, seed: int, epoch: int, rank: int) -> np.ndarray:
    # Derived from (seed, epoch, rank) alone, never from a running RNG, so a restart reproduces it.
    return np.random.default_rng([seed, epoch, rank]).permutation(num_rows)


def to_tensors(frame, schema: ShardSchema) -> tuple[torch.Tensor, torch.Tensor]:
    x = frame[list(schema.features)].to_numpy(dtype=np.float32)
    if schema.feature_mean:
        x = (x - np.asarray(schema.feature_mean, dtype=np.float32)) / np.asarray(schema.feature_std, dtype=np.float32)
    y = frame[schema.target].to_numpy()
    y_t = torch.from_numpy(y.astype(np.int64)) if schema.task == "classification" else torch.from_numpy(y.astype(np.float32))
    return torch.from_numpy(np.ascontiguousarray(x)), y_t


class PartitionData:
    def __init__(self, store: ObjectStore, manifest: ShardManifest, rank: int, world_size: int, batch_size: int):
        entry = manifest.partition_for_rank(rank, world_size)
        self.x, self.y = to_tensors(read_partition(store, entry), manifest.schema)
        self.rank = rank
        self.batch_size = batch_size
        self.batches_per_epoch = len(self.x) // batch_size

    def batches(self, seed: int, cursor: Cursor):
        """Yield (batch_index, x, y) for cursor.epoch from cursor.batch on."""
        order = torch.from_numpy(epoch_order(len(self.x), seed, cursor.epoch, self.rank))
        for b in range(cursor.batch, self.batches_per_epoch):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            yield b, self.x[idx], self.y[idx]
