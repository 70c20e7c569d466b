"""Split a table into per-worker partitions of whole minibatches plus an eval split (manifest.py's format).

Deterministic: the same rows and parameters give byte-identical partitions and the same manifest.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ringflow.training.manifest import (
    MANIFEST_NAME, ManifestError, PartitionEntry, ShardManifest, ShardSchema, sha256_hex,
)
from ringflow.training.store.base import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

# A target with at most this many distinct integer values is taken as class labels.
_MAX_INFERRED_CLASSES = 100


def dataframe_sha256(df: pd.DataFrame) -> str:
    """Content hash of a table, independent of how it was stored (CSV or Parquet, any compression)."""
    digest = hashlib.sha256(json.dumps([list(map(str, df.columns)), [str(t) for t in df.dtypes]]).encode())
    digest.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    return digest.hexdigest()


def infer_task(target: pd.Series) -> str:
    is_integral = pd.api.types.is_integer_dtype(target) or pd.api.types.is_bool_dtype(target)
    if is_integral and target.nunique() <= _MAX_INFERRED_CLASSES:
        return "classification"
    return "regression"


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf, compression="zstd")
    return buf.getvalue()


def plan_rows(num_rows: int, num_partitions: int, batch_size: int, eval_fraction: float, seed: int):
    """Row order for each partition and for eval. Pure: the heart of determinism, tested on its own."""
    if num_partitions < 1 or batch_size < 1:
        raise ManifestError("num_partitions and batch_size must be >= 1")
    if not 0 <= eval_fraction < 1:
        raise ManifestError(f"eval_fraction is {eval_fraction}; use a fraction in [0, 1)")
    order = np.random.default_rng(seed).permutation(num_rows)
    num_eval = int(round(num_rows * eval_fraction))
    eval_rows, train_rows = order[:num_eval], order[num_eval:]
    batches_per_partition = len(train_rows) // (num_partitions * batch_size)
    if batches_per_partition == 0:
        raise ManifestError(
            f"{len(train_rows)} training rows cannot fill one minibatch of {batch_size} on each of "
            f"{num_partitions} workers; lower batch_size or the worker count, or use more data"
        )
    used = batches_per_partition * num_partitions * batch_size
    # Stride by partition so each one is a uniform sample of the shuffled rows.
    partitions = [train_rows[:used][i::num_partitions] for i in range(num_partitions)]
    remainder = train_rows[used:]
    return partitions, np.concatenate([eval_rows, remainder]), len(remainder), batches_per_partition


def write_shards(
    df: pd.DataFrame,
    store: ObjectStore,
    *,
    target: str,
    num_partitions: int,
    batch_size: int,
    seed: int = 0,
    eval_fraction: float = 0.2,
    features: list[str] | None = None,
    task: str | None = None,
    source_uri: str = "",
) -> ShardManifest:
    """Write partitions, eval split and (last) manifest.json into `store`. A rerun with the same input and
    parameters finds the manifest already there and rewrites nothing."""
    if target not in df.columns:
        raise ManifestError(f"target column {target!r} is not in the dataset; columns are {list(df.columns)}")
    features = list(features) if features else [c for c in df.columns if c != target]
    missing = [c for c in features if c not in df.columns]
    if missing:
        raise ManifestError(f"feature columns {missing} are not in the dataset")
    non_numeric = [c for c in features if not pd.api.types.is_numeric_dtype(df[c])]
    if non_numeric:
        raise ManifestError(f"feature columns {non_numeric} are not numeric; encode them before sharding")
    task = task or infer_task(df[target])
    params = {"num_partitions": num_partitions, "batch_size": batch_size, "seed": seed,
              "eval_fraction": eval_fraction}
    data_sha = dataframe_sha256(df[features + [target]])
    fingerprint = sha256_hex(json.dumps({"data": data_sha, "params": params, "features": features,
                                         "target": target, "task": task}, sort_keys=True).encode())

    existing = _existing_manifest(store)
    if existing is not None:
        if existing.fingerprint != fingerprint:
            raise ManifestError(
                f"{store.uri} already holds shards of other data or parameters (fingerprint "
                f"{existing.fingerprint[:12]}…, this one {fingerprint[:12]}…); shard into a new location"
            )
        log.info("shards at %s are already up to date (fingerprint %s); nothing rewritten", store.uri, fingerprint[:12])
        return existing

    table = df[features + [target]].reset_index(drop=True)
    table[features] = table[features].astype("float32")
    if task == "classification":
        labels = table[target]
        if not (pd.api.types.is_integer_dtype(labels) and labels.min() >= 0):
            raise ManifestError(f"classification target {target!r} must hold class indices 0..K-1")
        table[target] = labels.astype("int64")
        num_classes = int(labels.max()) + 1
    else:
        table[target] = table[target].astype("float32")
        num_classes = 0

    parts, eval_rows, remainder, batches = plan_rows(len(table), num_partitions, batch_size, eval_fraction, seed)
    train_values = table.loc[np.concatenate(parts), features].to_numpy(dtype=np.float64)
    std = train_values.std(axis=0)
    schema = ShardSchema(features=tuple(features), target=target, task=task, num_classes=num_classes,
                         feature_mean=tuple(float(v) for v in train_values.mean(axis=0)),
                         feature_std=tuple(float(v) if v > 0 else 1.0 for v in std))

    entries = []
    for index, rows in enumerate(parts):
        key = f"part-{index:05d}.parquet"
        data = _parquet_bytes(table.loc[rows])
        store.put_bytes(key, data)
        entries.append(PartitionEntry(key=key, rows=len(rows), sha256=sha256_hex(data), index=index,
                                      minibatches=batches))
    eval_entry = None
    if len(eval_rows):
        data = _parquet_bytes(table.loc[eval_rows])
        store.put_bytes("eval.parquet", data)
        eval_entry = PartitionEntry(key="eval.parquet", rows=len(eval_rows), sha256=sha256_hex(data))

    manifest = ShardManifest(
        fingerprint=fingerprint,
        source={"uri": source_uri, "sha256": data_sha, "rows": len(df)},
        params=params, schema=schema, partitions=tuple(entries), eval=eval_entry, remainder_rows=remainder,
    )
    store.put_bytes(MANIFEST_NAME, manifest.to_json().encode())  # last: its presence means "complete"
    return manifest


def _existing_manifest(store: ObjectStore) -> ShardManifest | None:
    try:
        return ShardManifest.from_json(store.get_bytes(MANIFEST_NAME))
    except ObjectNotFound:
        return None


def read_partition(store: ObjectStore, entry: PartitionEntry) -> pd.DataFrame:
    """Read one partition, refusing bytes that do not match the manifest."""
    data = store.get_bytes(entry.key)
    entry.check(data)
    return pq.read_table(io.BytesIO(data)).to_pandas()
