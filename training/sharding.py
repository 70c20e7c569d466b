"""Split a table into per-worker partitions of whole minibatches plus an eval split (manifest.py's format).

Deterministic: the same rows and parameters give byte-identical partitions and the same manifest.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import logging
import os

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


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
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

    # Column by column into Arrow: no float64 copy of the whole table, and `take` is cheaper than pandas .loc.
    columns = {f: df[f].to_numpy(dtype=np.float32) for f in features}
    labels = df[target]
    if task == "classification":
        if not (pd.api.types.is_integer_dtype(labels) and labels.min() >= 0):
            raise ManifestError(f"classification target {target!r} must hold class indices 0..K-1")
        columns[target] = labels.to_numpy(dtype=np.int64)
        num_classes = int(labels.max()) + 1
    else:
        columns[target] = labels.to_numpy(dtype=np.float32)
        num_classes = 0
    table = pa.table(columns)

    parts, eval_rows, remainder, batches = plan_rows(len(table), num_partitions, batch_size, eval_fraction, seed)
    train_rows = np.concatenate(parts)
    mean, std = [], []
    for f in features:
        values = columns[f][train_rows]
        mean.append(float(values.mean(dtype=np.float64)))
        spread = float(values.std(dtype=np.float64))
        std.append(spread if spread > 0 else 1.0)
    schema = ShardSchema(features=tuple(features), target=target, task=task, num_classes=num_classes,
                         feature_mean=tuple(mean), feature_std=tuple(std))

    def write(key: str, rows: np.ndarray) -> tuple[str, str]:
        data = _parquet_bytes(table.take(pa.array(rows)))
        store.put_bytes(key, data)
        return key, sha256_hex(data)

    jobs = [(f"part-{i:05d}.parquet", rows) for i, rows in enumerate(parts)]
    if len(eval_rows):
        jobs.append(("eval.parquet", eval_rows))
    # Parquet encoding and compression release the GIL: partitions are written in parallel.
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        written = dict(pool.map(lambda job: write(*job), jobs))
    entries = [PartitionEntry(key=key, rows=len(rows), sha256=written[key], index=i, minibatches=batches)
               for i, (key, rows) in enumerate(jobs[:len(parts)])]
    eval_entry = (PartitionEntry(key="eval.parquet", rows=len(eval_rows), sha256=written["eval.parquet"])
                  if len(eval_rows) else None)

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
