"""Split a validated dataset into partition files (ringflow.training.core.sharding) at a deterministic place;
any number of workers trains on them.

The folder is `<output_uri>/<dataset>/w<N>-b<B>-<hash>/` (store_layout.shard_uri), the hash covering the
dataset's content fingerprint (datasets.ContentHash, computed while the one streaming read of the data goes by)
and every sharding parameter. Memory stays bounded whatever the dataset's size (sharding.py says how). A rerun
(a cleared task, a retried DAG run, another DAG on the same data) finds the complete manifest there and
rewrites nothing; new data or new parameters get a new folder, so training never reads shards that do not
match its data.

`shard_dataset()` is the whole step without Airflow; the operator is a thin wrapper around it.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from airflow.sdk import BaseOperator

from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_store_for
from ringflow.training.core.runs import store_layout

log = logging.getLogger(__name__)


def _summary(manifest, manifest_uri: str, shard_uri: str, reused: bool) -> dict[str, Any]:
    return {
        "manifest_uri": manifest_uri,
        "shard_uri": shard_uri,
        "partitions": manifest.num_partitions,
        "rows_per_partition": manifest.partitions[0].rows,
        "minibatches_per_partition": manifest.minibatches_per_partition,
        "batch_size": manifest.batch_size,
        "eval_rows": manifest.eval.rows if manifest.eval else 0,
        "remainder_rows": manifest.remainder_rows,
        "fingerprint": manifest.fingerprint,
        "reused": reused,
    }


def shard_dataset(dataset_uri: str, output_uri: str, *, num_partitions: int, batch_size: int, seed: int = 0,
                  eval_fraction: float = 0.2, target: str = "target", conn_id: str | None = DEFAULT_S3_CONN_ID,
                  logger: logging.Logger | None = None) -> dict[str, Any]:
    """Shard `dataset_uri` into `num_partitions` partition files under `output_uri` (the shards root). Returns
    the summary the operator pushes to XCom; `manifest_uri` is what the train task needs."""
    from ringflow.training.formats.datasets import open_dataset
    from ringflow.training.core.sharding import shard

    logger = logger or log
    num_partitions, batch_size, seed = int(num_partitions), int(batch_size), int(seed)
    eval_fraction = float(eval_fraction)
    params = {"num_partitions": num_partitions, "batch_size": batch_size, "seed": seed,
              "eval_fraction": eval_fraction}
    chosen: dict[str, str] = {}

    def destination(content_sha256: str):
        # The folder is known once the data has been read: its content fingerprint is part of the name.
        key = store_layout.shard_key(content_sha256, {**params, "target": target})
        chosen["folder"] = store_layout.shard_uri(output_uri, dataset_uri, key)
        return open_store_for(chosen["folder"], conn_id)

    logger.info("sharding %s into %d partitions of whole %d-row minibatches under %s (streamed)",
                dataset_uri, num_partitions, batch_size, output_uri)
    with open_dataset(dataset_uri, lambda parent: open_store_for(parent, conn_id)) as dataset:
        result = shard(dataset, destination, target=target, num_partitions=num_partitions, batch_size=batch_size,
                       seed=seed, eval_fraction=eval_fraction, source_uri=dataset_uri)
    manifest, folder = result.manifest, chosen["folder"]
    manifest_uri = store_layout.manifest_uri(folder)
    if result.reused:
        logger.info("shards for %s are already at %s (fingerprint %s): nothing rewritten",
                    dataset_uri, folder, manifest.fingerprint[:12])
        return _summary(manifest, manifest_uri, folder, reused=True)
    per_part = manifest.partitions[0].rows
    logger.info("wrote %d partitions x %d rows (%d minibatches each) and an eval split of %d rows",
                manifest.num_partitions, per_part, manifest.minibatches_per_partition,
                manifest.eval.rows if manifest.eval else 0)
    if manifest.remainder_rows:
        logger.info("%d training rows did not fill a whole %d-row minibatch in every one of the %d partitions: "
                    "they were moved to the eval split (not dropped), so every partition holds the same number "
                    "of minibatches", manifest.remainder_rows, batch_size, num_partitions)
    else:
        logger.info("no remainder: the training rows fill whole minibatches in every partition")
    return _summary(manifest, manifest_uri, folder, reused=False)


class ShardDatasetOperator(BaseOperator):
    """Shard `dataset_uri` into `num_partitions` partition files in a deterministic folder under `output_uri`
    (storage only: a run trains on them with any number of workers).

    output_uri: the shards root, e.g. `<store>/shards` (store_layout.shards_root); the operator picks the
    folder below it from the data and the parameters. Numbers may be templates (`"{{ params.epochs }}"`):
    they are converted after rendering.
    Returns (XCom) `{"manifest_uri", "shard_uri", "partitions", "rows_per_partition",
    "minibatches_per_partition", "batch_size", "eval_rows", "remainder_rows", "fingerprint", "reused"}`.
    """

    template_fields: Sequence[str] = ("dataset_uri", "output_uri", "num_partitions", "batch_size", "seed",
                                      "eval_fraction", "target", "conn_id")
    ui_color = "#e8f0fe"

    def __init__(self, *, dataset_uri: str, output_uri: str, num_partitions: int | str | None = None,
                 batch_size: int | str, seed: int | str = 0, eval_fraction: float | str = 0.2,
                 target: str = "target", conn_id: str | None = DEFAULT_S3_CONN_ID, **kwargs: Any) -> None:
        if "num_workers" in kwargs:  # the old name: refused when the DAG file is parsed, with the new one
            raise TypeError(f"ShardDatasetOperator: num_workers is now num_partitions (the number of partition "
                            f"files; any number of workers trains on them): pass "
                            f"num_partitions={kwargs['num_workers']!r}")
        if num_partitions is None:
            raise TypeError("ShardDatasetOperator needs num_partitions: the number of partition files to write")
        super().__init__(**kwargs)
        self.dataset_uri, self.output_uri = dataset_uri, output_uri
        self.num_partitions, self.batch_size, self.seed = num_partitions, batch_size, seed
        self.eval_fraction, self.target, self.conn_id = eval_fraction, target, conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        return shard_dataset(self.dataset_uri, self.output_uri, num_partitions=self.num_partitions,
                             batch_size=self.batch_size, seed=self.seed, eval_fraction=self.eval_fraction,
                             target=self.target, conn_id=self.conn_id, logger=self.log)
