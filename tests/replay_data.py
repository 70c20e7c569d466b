"""A dataset with a few rows that pass validation (every value finite) but make the loss infinite: scikit-learn's
diabetes, as regression, with the target of some rows set to 1e30 (its square overflows float32).

Why the target and not a feature: the shard step normalizes each feature with its mean and standard deviation
over the data, which brings a huge feature of k rows among n back to about sqrt(n/k); the target is not
normalized, so a huge one reaches the loss as it is."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from ringflow.training.formats.config import RowRef

HUGE = 1e30
BAD_SOURCE_ROWS = (5, 77, 301)


def bad_rows_frame():
    from ringflow.training.formats.datasets import load_builtin

    frame = load_builtin("diabetes")
    frame.loc[list(BAD_SOURCE_ROWS), "target"] = HUGE
    return frame


def write_bad_rows_shards(store, num_partitions: int = 2, batch_size: int = 16):
    """The shards of the bad-rows dataset in `store`: its manifest."""
    from ringflow.training.core.sharding import write_shards

    return write_shards(bad_rows_frame(), store, target="target", num_partitions=num_partitions,
                        batch_size=batch_size, task="regression")


def huge_target_rows(root: str, manifest) -> list[RowRef]:
    """Where the shard step put the bad rows that landed in training partitions: (partition key, row)."""
    found = []
    for p in manifest.partitions:
        target = pq.read_table(f"{root}/{p.key}", columns=["target"]).column("target").to_numpy()
        found += [RowRef(p.key, int(r)) for r in np.flatnonzero(target > HUGE / 10)]
    return found
