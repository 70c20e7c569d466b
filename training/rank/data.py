"""A rank's partition as torch tensors: partition_batches.py's streaming reader (its order, windows and cursor:
the same rows in the same order for every engine), each window decoded into torch tensors (pinned on a GPU
host) and each minibatch put on the rank's device.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from .devices import Placement, to_device
from ..formats.manifest import ShardSchema
from .partition_batches import (  # noqa: F401 - the reader's names, where the torch side has always found them
    SHUFFLE_WINDOW, Cursor, PartitionBatches, Window, epoch_order, epoch_windows, to_arrays,
)


def to_tensors(table: "pa.Table | pa.RecordBatch", schema: ShardSchema) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of a table of stored rows as tensors (to_arrays: shapes, normalization, dtypes)."""
    x, y = to_arrays(table, schema)
    return torch.from_numpy(x), torch.from_numpy(y)


class PartitionData(PartitionBatches):
    """PartitionBatches serving torch tensors on the rank's device.

    placement: where the batches go (devices.py). On a GPU a window is put in pinned host memory by the
    loader thread, and each batch is copied from it without blocking, so the copy overlaps the compute."""

    placement: Placement | None

    def _decode(self, table: "pa.Table") -> tuple[torch.Tensor, torch.Tensor]:
        return to_tensors(table, self.schema)

    def _index(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rows)

    def _pin(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.placement is not None and self.placement.pin_memory:
            return x.pin_memory(), y.pin_memory()
        return x, y

    def _cat(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # Into pinned memory when the window was: the rest of the window is served from it.
        pin = self.placement is not None and self.placement.pin_memory
        out = torch.empty((len(a) + len(b), *a.shape[1:]), dtype=a.dtype, pin_memory=pin)
        return torch.cat([a, b], out=out)

    def _out(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.placement is None:
            return x, y
        return to_device(x, self.placement), to_device(y, self.placement)
