"""The one check of a job against its shards, made before anything is launched, on every backend.

`check_job` is pure: a job config, the manifest of its shards and the worker count in, a ConfigError that
says what to fix out. `ringflow train` (launcher.py) runs it through `preflight`, which also reads the config
and the manifest; the Airflow train operator runs it itself, with the manifest read through its connection,
before it hands the job to the local or the MPIJob backend. Torch-free, so Airflow code can import it.
"""
from __future__ import annotations

from ..formats.config import ConfigError, JobConfig, load_job_config
from ..formats.engines import engine_spec
from ..formats.manifest import ShardManifest
from ..formats.model_factory import find_factory, find_factory_module

# Why a TensorFlow model factory is only looked for, not imported: it imports TensorFlow, which only the TF
# venv has (scripts/setup.sh), not the Airflow/torch venv the preflight runs in.
_TF_FACTORY_NOT_IMPORTED = ("looked for without importing it: a TensorFlow factory imports TensorFlow, which "
                            "only the TF venv has; the rank checks its function when it starts")


def check_job(cfg: JobConfig, manifest: ShardManifest, num_workers: int, *, check_factory: bool = True,
              engine: str | None = None) -> None:
    """Raise ConfigError unless `cfg` can train on `manifest` with `num_workers` workers under `engine` (None:
    the config's; `ringflow train --engine` may choose another).

    - every worker gets at least one whole micro-batch of the epoch's stream (a run's last micro-batch may be
      partial: the loop weighs it by its rows);
    - a custom model factory can be imported (`check_factory`; off where the job's code lives elsewhere, as in
      an MPIJob's image, which the rank checks when it starts); for the TensorFlow engine its module is only
      looked for (find_spec), since importing it would import TensorFlow.
    """
    rows = manifest.training_rows
    if cfg.batch_size * num_workers > rows:
        raise ConfigError("batch_size", f"{num_workers} workers x {cfg.batch_size} rows exceeds the shards' "
                                        f"{rows} training rows: not one whole micro-batch per worker",
                          f"use at most {rows // num_workers} rows per worker, or fewer workers")
    if check_factory and cfg.model.kind == "custom":
        if engine_spec(engine or cfg.engine).starts_workers_itself:  # its ranks run in the TF venv
            find_factory_module(cfg.model.factory, why=_TF_FACTORY_NOT_IMPORTED)
        else:
            find_factory(cfg.model.factory)


def preflight(config_uri: str, num_workers: int, verify_all_shard_bytes: bool = False,
              engine: str | None = None) -> JobConfig:
    """Read the job config and its manifest, `check_job` them for `engine` (None: the config's), and check the
    shards are what the manifest describes (core/shard_check.py: sizes and footers; every byte with
    `verify_all_shard_bytes`): what `ringflow train` runs first."""
    from .shard_check import ShardChanged, verify_shards
    from ..formats.manifest import ManifestError, load_manifest
    from ..store import ObjectNotFound

    cfg = load_job_config(config_uri)
    try:
        manifest, shard_store = load_manifest(cfg.manifest_uri)
    except ObjectNotFound as exc:
        raise ConfigError("manifest_uri", f"{cfg.manifest_uri} does not exist",
                          "run the shard step first or fix the path") from exc
    except ManifestError as exc:
        raise ConfigError("manifest_uri", str(exc), "re-run the shard step") from exc
    check_job(cfg, manifest, num_workers, engine=engine)
    try:
        verify_shards(manifest, shard_store, full=verify_all_shard_bytes)
    except ShardChanged as exc:
        raise ConfigError("manifest_uri", str(exc),
                          "re-run the shard step (ringflow shard) and train on the manifest it writes") from exc
    return cfg
