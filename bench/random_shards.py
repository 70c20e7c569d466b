"""Shards of random classification rows for the benchmarks (throughput.py, gpu_check.py): float32
features f0.., an integer target, written by ringflow's own shard step so the jobs read what a real run
reads."""
from __future__ import annotations

from pathlib import Path


def write_random_shards(folder: Path, *, partitions: int, rows_per_partition: int, features: int, classes: int,
                        batch: int) -> str:
    """`partitions` partitions of `rows_per_partition` rows each (seeded: the same rows every time) in
    `folder`; the path of their manifest."""
    import numpy as np
    import pandas as pd

    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import LocalFolderStore

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.standard_normal((rows_per_partition * partitions, features)).astype("float32"),
                         columns=[f"f{i}" for i in range(features)])
    frame["target"] = rng.integers(0, classes, len(frame))
    write_shards(frame, LocalFolderStore(str(folder)), target="target", num_partitions=partitions,
                 batch_size=batch, eval_fraction=0.0)
    return str(folder / "manifest.json")
