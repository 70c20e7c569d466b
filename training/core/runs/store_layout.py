"""Where the pipeline puts things, in one place. Pure string functions: no I/O, no Airflow.

Under one base store URI (a folder, file:// or s3://bucket/prefix):

    datasets/...                                   input data (by convention; any URI works)
    shards/<dataset>/<key>/manifest.json           ShardDatasetOperator (key: data and parameters)
    runs/<dag_id>/<run_id>/<pipeline>/             one training run: checkpoints/, health.jsonl,
                                                   result.json, eval.json, health.png (run_layout.py);
                                                   <pipeline> is the TaskGroup id (a DAG may hold several)
    runs/<dag_id>/<run_id>/<pipeline>/m<i>/        map index i of a mapped train task (a sweep's candidate)
    models/<name>/v<N>/, models/<name>/production.json   the model registry (model_registry.py)

The base is `RINGFLOW_STORE` if set, else the folder `ringflow-data` under AIRFLOW_HOME: the embedded
default needs no server. In production set RINGFLOW_STORE=s3://bucket/prefix and the Airflow connection
`ringflow_s3`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from typing import Any

from ..registry.model_registry import POINTER_FILE
from ...formats.manifest import MANIFEST_NAME

STORE_ENV = "RINGFLOW_STORE"
DEFAULT_FOLDER = "ringflow-data"
DATASETS, SHARDS, RUNS, MODELS = "datasets", "shards", "runs", "models"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def default_store_uri() -> str:
    """`$RINGFLOW_STORE`, else `$AIRFLOW_HOME/ringflow-data` (AIRFLOW_HOME defaulting to ~/airflow)."""
    configured = os.environ.get(STORE_ENV, "").strip()
    if configured:
        return configured
    home = os.environ.get("AIRFLOW_HOME") or os.path.join("~", "airflow")
    return os.path.join(os.path.abspath(os.path.expanduser(home)), DEFAULT_FOLDER)


def join(base: str, *parts: str) -> str:
    """`base` and '/'-separated parts, for paths and URIs alike (no double or trailing slashes)."""
    tail = "/".join(p.strip("/") for p in parts if p and p.strip("/"))
    if not tail:
        return base
    return f"{base.rstrip('/')}/{tail}" if base.rstrip("/") else f"/{tail}"


def safe_segment(text: str) -> str:
    """One path segment: characters outside [A-Za-z0-9._-] become '_' (run ids hold ':' and '+')."""
    cleaned = _UNSAFE.sub("_", str(text))
    return "_" if cleaned in ("", ".", "..") else cleaned


def dataset_slug(dataset_uri: str) -> str:
    """A readable folder name for a dataset: `builtin:digits` -> `digits`, `s3://b/x/wine.csv` -> `wine`."""
    if dataset_uri.startswith("builtin:"):
        return safe_segment(dataset_uri.split(":", 1)[1])
    path = urllib.parse.urlsplit(dataset_uri).path if "://" in dataset_uri else dataset_uri
    name = os.path.basename(path.rstrip("/")) or "dataset"
    stem = name.split(".", 1)[0] or name
    return safe_segment(stem)


def shard_key(content_sha256: str, params: dict[str, Any]) -> str:
    """The folder for one sharding of one dataset content: readable parameters plus a hash of the data
    and every parameter, so new data or new parameters never land on old shards, and a rerun of the
    same lands on the same folder (and rewrites nothing)."""
    digest = hashlib.sha256(json.dumps({"data": content_sha256, "params": params}, sort_keys=True,
                                       default=str).encode()).hexdigest()[:16]
    return f"w{params.get('num_partitions')}-b{params.get('batch_size')}-{digest}"


def shards_root(base: str) -> str:
    return join(base, SHARDS)


def shard_uri(shards_root_uri: str, dataset_uri: str, key: str) -> str:
    return join(shards_root_uri, dataset_slug(dataset_uri), key)


def manifest_uri(shard_folder_uri: str) -> str:
    return join(shard_folder_uri, MANIFEST_NAME)


def run_uri(base: str, dag_id: str, run_id: str, pipeline: str | None = None, map_index: int | None = None) -> str:
    """The training run folder of one DAG run: `runs/<dag_id>/<run_id>/`, plus `<pipeline>/` (the id of the
    train task's TaskGroup) when one DAG holds several pipelines, so that each has its own run folder, plus
    `m<map_index>/` for a mapped train task (a sweep), so each mapped copy has its own; Airflow gives an
    unmapped task map index -1, which adds nothing. No try number: every try of the task uses the same
    folder, so a retry resumes from its checkpoints."""
    if map_index is not None and (isinstance(map_index, bool) or not isinstance(map_index, int) or map_index < -1):
        raise ValueError(f"map_index is {map_index!r}; use the task instance's map index (-1 or None: not mapped)")
    mapped = f"m{map_index}" if map_index is not None and map_index >= 0 else ""
    return join(base, RUNS, safe_segment(dag_id), safe_segment(run_id), safe_segment(pipeline) if pipeline else "",
                mapped)


def production_pointer_uri(base: str, name: str) -> str:
    """Where serving reads which version is in production (model_registry.py writes it)."""
    return join(base, MODELS, name, POINTER_FILE)
