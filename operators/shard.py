"""Split a validated dataset into per-worker partitions (ringflow.training.sharding) at a deterministic place.

The folder is `<output_uri>/<dataset>/w<N>-b<B>-<hash>/` (layout.shard_uri), the hash covering the dataset's
content and every sharding parameter. A rerun (a cleared task, a retried DAG run, another DAG on the same
data) finds the complete manifest there and rewrites nothing; new data or new parameters get a new folder,
so training never reads shards that do not match its data.

`shard_dataset()` is the whole step without Airflow; the operator is a thin wrapper around it.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any, Sequence

from airflow.sdk import BaseOperator

from ringflow.operators import layout
from ringflow.operators.connections import DEFAULT_CONN_ID, open_store_for

log = logging.getLogger(__name__)


def _store_for(uri: str, conn_id: str | None):
    # None means "the default connection, if this turns out to be S3": local paths need none.
    return open_store_for(uri, conn_id or DEFAULT_CONN_ID)


def read_dataset_and_digest(dataset_uri: str, conn_id: str | None = None):
    """(DataFrame, sha256 of its content). For files the digest is of the bytes as stored (cheap, and
    read anyway); for `builtin:<name>` it is of the table."""
    from ringflow.training.datasets import check_table_name, load_builtin, parse_table
    from ringflow.training.sharding import dataframe_sha256
    from ringflow.training.store import split_uri

    if dataset_uri.startswith("builtin:"):
        df = load_builtin(dataset_uri.split(":", 1)[1])
        return df, dataframe_sha256(df)
    check_table_name(dataset_uri)
    parent, name = split_uri(dataset_uri)
    data = _store_for(parent, conn_id).get_bytes(name)
    return parse_table(name, data), hashlib.sha256(data).hexdigest()


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


def shard_dataset(dataset_uri: str, output_uri: str, *, num_workers: int, batch_size: int, seed: int = 0,
                  eval_fraction: float = 0.2, target: str = "target", conn_id: str | None = None,
                  logger: logging.Logger | None = None) -> dict[str, Any]:
    """Shard `dataset_uri` for `num_workers` workers under `output_uri` (the shards root). Returns the
    summary the operator pushes to XCom; `manifest_uri` is what the train task needs."""
    from ringflow.training.manifest import MANIFEST_NAME, ManifestError, ShardManifest
    from ringflow.training.sharding import write_shards
    from ringflow.training.store import ObjectNotFound

    logger = logger or log
    num_workers, batch_size, seed = int(num_workers), int(batch_size), int(seed)
    eval_fraction = float(eval_fraction)
    params = {"num_partitions": num_workers, "batch_size": batch_size, "seed": seed,
              "eval_fraction": eval_fraction}

    df, digest = read_dataset_and_digest(dataset_uri, conn_id)
    folder = layout.shard_uri(output_uri, dataset_uri, layout.shard_key(digest, {**params, "target": target}))
    manifest_uri = layout.manifest_uri(folder)
    store = _store_for(folder, conn_id)

    try:
        existing = ShardManifest.from_json(store.get_bytes(MANIFEST_NAME))
    except ObjectNotFound:
        existing = None
    if existing is not None and existing.params == params and existing.schema.target == target:
        logger.info("shards for %s are already at %s (fingerprint %s): nothing rewritten",
                    dataset_uri, folder, existing.fingerprint[:12])
        return _summary(existing, manifest_uri, folder, reused=True)
    if existing is not None:  # only a hash collision or a hand-edited manifest gets here
        raise ManifestError(f"{manifest_uri} holds shards made with other parameters ({existing.params}); "
                            f"delete {folder} and rerun this task")

    logger.info("sharding %s (%d rows, %d columns) into %d partitions of whole %d-row minibatches at %s",
                dataset_uri, len(df), len(df.columns), num_workers, batch_size, folder)
    manifest = write_shards(df, store, target=target, num_partitions=num_workers, batch_size=batch_size,
                            seed=seed, eval_fraction=eval_fraction, source_uri=dataset_uri)
    per_part = manifest.partitions[0].rows
    logger.info("wrote %d partitions x %d rows (%d minibatches each) and an eval split of %d rows",
                manifest.num_partitions, per_part, manifest.minibatches_per_partition,
                manifest.eval.rows if manifest.eval else 0)
    if manifest.remainder_rows:
        logger.info("%d training rows did not fill a whole %d-row minibatch on every one of the %d workers: "
                    "they were moved to the eval split (not dropped), so every worker takes the same number "
                    "of synchronous steps", manifest.remainder_rows, batch_size, num_workers)
    else:
        logger.info("no remainder: the training rows fill whole minibatches on every worker")
    return _summary(manifest, manifest_uri, folder, reused=False)


class ShardDatasetOperator(BaseOperator):
    """Shard `dataset_uri` for `num_workers` Horovod workers into a deterministic folder under `output_uri`.

    output_uri: the shards root, e.g. `<store>/shards` (layout.shards_root); the operator picks the
    folder below it from the data and the parameters. Numbers may be templates (`"{{ params.epochs }}"`):
    they are converted after rendering.
    Returns (XCom) `{"manifest_uri", "shard_uri", "partitions", "rows_per_partition",
    "minibatches_per_partition", "batch_size", "eval_rows", "remainder_rows", "fingerprint", "reused"}`.
    """

    template_fields: Sequence[str] = ("dataset_uri", "output_uri", "num_workers", "batch_size", "seed",
                                      "eval_fraction", "target", "conn_id")
    ui_color = "#e8f0fe"

    def __init__(self, *, dataset_uri: str, output_uri: str, num_workers: int | str, batch_size: int | str,
                 seed: int | str = 0, eval_fraction: float | str = 0.2, target: str = "target",
                 conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dataset_uri, self.output_uri = dataset_uri, output_uri
        self.num_workers, self.batch_size, self.seed = num_workers, batch_size, seed
        self.eval_fraction, self.target, self.conn_id = eval_fraction, target, conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        return shard_dataset(self.dataset_uri, self.output_uri, num_workers=self.num_workers,
                             batch_size=self.batch_size, seed=self.seed, eval_fraction=self.eval_fraction,
                             target=self.target, conn_id=self.conn_id, logger=self.log)
