"""MLflow's model registry beside ringflow's: a promotion registers the promoted checkpoint as a model
version and moves the alias (default `champion`) to it; a rollback moves the alias to the version that holds
the checkpoint production went back to.

ringflow's registry (training/core/registry) stays the source of truth: its compare-and-swap decides what is in
production, and MLflow follows. Each MLflow version carries the tag `ringflow.version` = the ringflow
registry version it mirrors, so a retried promotion finds its version instead of registering a second one,
and a rollback finds the version to point the alias at. MLflow's aliases, not its deprecated stages:
`models:/<name>@champion` loads the model in production.
"""
from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import tempfile
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ...formats.run_folder import RunFolder
from ...formats.manifest import ShardManifest
from ...store.base import ObjectStore
from ...store import split_uri
from . import served_model
from .mlflow_runs import client_for, ensure_run
from .settings import TrackingSettings, tracking_env
from ...formats.script_checkpoint import promoted_script
from ...rank.training_state import STATE_FILE

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger(__name__)

TAG_STORE_VERSION = "ringflow.version"
MODEL_ARTIFACT = "model"
SCRIPT_FILE = "script.json"  # beside a user script's state file in its MLflow model artifact
REGISTRATION_WAIT_SECONDS = 300


def version_of(client: "MlflowClient", name: str, store_version: int) -> "ModelVersion | None":
    """The MLflow version of model `name` that mirrors ringflow registry version `store_version`."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        return None
    token = None
    while True:
        page = client.search_model_versions(f"name='{name}'", max_results=200, page_token=token)
        for version in page:
            if version.tags.get(TAG_STORE_VERSION) == str(store_version):
                return version
        token = page.token
        if not token:
            return None


def _requirements() -> list[str]:
    """What a serving environment installs; given, not inferred (inference loads the model in a subprocess)."""
    reqs = []
    for dist in ("mlflow-skinny", "torch", "numpy", "pandas", "pyarrow"):
        try:
            reqs.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    # ringflow itself is the flavor's code (served_model is the loader module); it is not on PyPI.
    return reqs + ["ringflow"]


def model_data(folder: str, *, run_folder: RunFolder, checkpoint: str,
               open_store: Callable[[str], ObjectStore], source: Mapping[str, Any]) -> served_model.ServedModel:
    """Write the pyfunc data folder for `checkpoint` of the run (its sha256 checked on the way) and load it
    back: a model that would not load never gets registered."""
    loaded = run_folder.checkpoints().load(checkpoint)
    meta = loaded.manifest.meta
    parent, name = split_uri(meta["manifest_uri"])
    schema = ShardManifest.from_json(open_store(parent).get_bytes(name)).schema
    served_model.write_model_data(folder, state=loaded.files[STATE_FILE], model=meta["model"], schema=schema,
                                  input_shape=meta["schema"].get("input_shape"), source=source)
    return served_model.load(folder)


def _register_script_model(folder: str, run_id: str, model_name: str, files: Mapping[str, bytes],
                            script: Mapping[str, Any]) -> int:
    """A user script's promoted checkpoint as an MLflow model version: its state file and SCRIPT_FILE (what
    MODEL.json's "script" says: the script, its bundle, engine, how to load it) under the run's `model`
    artifact. Not a pyfunc: the model's class is the script's, which ringflow cannot build. The version's number."""
    import mlflow

    os.makedirs(f"{folder}/{MODEL_ARTIFACT}")
    with open(f"{folder}/{MODEL_ARTIFACT}/{script['state_file']}", "wb") as fh:
        fh.write(files[script["state_file"]])
    with open(f"{folder}/{MODEL_ARTIFACT}/{SCRIPT_FILE}", "w") as fh:
        json.dump(script, fh, indent=1, sort_keys=True)
    from mlflow.exceptions import MlflowException

    with mlflow.start_run(run_id=run_id) as run:
        mlflow.log_artifacts(f"{folder}/{MODEL_ARTIFACT}", MODEL_ARTIFACT)
        source = f"{run.info.artifact_uri.rstrip('/')}/{MODEL_ARTIFACT}"
    client = mlflow.MlflowClient()
    try:
        client.get_registered_model(model_name)
    except MlflowException:
        client.create_registered_model(model_name)
    # Artifacts, not a logged model (MLflow's register_model wants an MLmodel): a version of the folder itself.
    version = client.create_model_version(model_name, source, run_id=run_id,
                                          await_creation_for=REGISTRATION_WAIT_SECONDS)
    return int(version.version)


def register_promotion(settings: TrackingSettings, *, experiment: str, run_uri: str, run_folder: RunFolder,
                       checkpoint: str, model_name: str, store_version: int,
                       open_store: Callable[[str], ObjectStore], metrics: Mapping[str, Any] | None = None) -> int:
    """Register `checkpoint` of the run as a version of `model_name` (once per ringflow version) in the run's
    MLflow run, and point settings.alias at it. Returns the MLflow version number."""
    import mlflow

    with tracking_env(settings):
        client = client_for(settings)
        existing = version_of(client, model_name, store_version)
        if existing is None:
            run = ensure_run(client, experiment, run_uri)
            source = {"run_uri": run_uri, "checkpoint": checkpoint, "ringflow_version": store_version}
            head = run_folder.checkpoints().read_manifest(checkpoint)
            script = promoted_script(head.meta, head.files, run_uri)
            with tempfile.TemporaryDirectory(prefix="ringflow-mlflow-model-") as tmp:
                if script is not None:  # a user script's model: its state file and how to load it, no pyfunc
                    files = run_folder.checkpoints().load(checkpoint).files  # its sha256 checked on the way
                    number = _register_script_model(tmp, run.info.run_id, model_name, files, script)
                else:
                    model = model_data(f"{tmp}/data", run_folder=run_folder, checkpoint=checkpoint,
                                       open_store=open_store, source=source)
                    with mlflow.start_run(run_id=run.info.run_id):
                        info = mlflow.pyfunc.log_model(
                            name=MODEL_ARTIFACT, loader_module=served_model.__name__, data_path=f"{tmp}/data",
                            pip_requirements=_requirements(), signature=served_model.signature_for(model.schema),
                            registered_model_name=model_name, await_registration_for=REGISTRATION_WAIT_SECONDS)
                    number = int(info.registered_model_version)
            tags = {TAG_STORE_VERSION: str(store_version), "ringflow.run_uri": run_uri,
                    "ringflow.checkpoint": checkpoint,
                    **{f"eval.{k}": str(v) for k, v in (metrics or {}).items()}}
            for key, value in tags.items():
                client.set_model_version_tag(model_name, str(number), key, value)
        else:
            number = int(existing.version)
        client.set_registered_model_alias(model_name, settings.alias, str(number))
    log.info("MLflow model %r version %d (ringflow version %d) is now @%s", model_name, number, store_version,
             settings.alias)
    return number


def point_alias(settings: TrackingSettings, *, model_name: str, store_version: int) -> int | None:
    """After a rollback: the alias on the MLflow version mirroring `store_version`. If none does (promoted
    before MLflow was configured), the alias is removed rather than left on a model not in production;
    returns None then."""
    from mlflow.exceptions import MlflowException

    alias = settings.alias  # checked when the settings were made
    with tracking_env(settings):
        client = client_for(settings)
        version = version_of(client, model_name, store_version)
        if version is None:
            try:
                client.delete_registered_model_alias(model_name, alias)
            except MlflowException:
                pass  # no such model or alias: nothing points at the wrong version
            log.warning("MLflow model %r has no version for ringflow version %d (promoted before MLflow was "
                        "configured?): alias @%s removed; register it to point the alias at it",
                        model_name, store_version, alias)
            return None
        client.set_registered_model_alias(model_name, alias, str(version.version))
    log.info("MLflow model %r: @%s is version %s (ringflow version %d)", model_name, alias, version.version,
             store_version)
    return int(version.version)
