"""One MLflow run per ringflow run folder: the job's params, the per-step measurements with their step, the
verdict as a tag, and result.json, health.png and eval.json as artifacts.

The run folder is the identity: the MLflow run carries the tag `ringflow.run_key` (a hash of the run URI, safe
in a filter string) and is found by it, so the train, evaluate and promote tasks, and a retried train task,
all log into the same MLflow run without passing its id around. A retry logs only the health records after
the last one logged (`ringflow.health_seq_logged`, the records' own `seq`), so no step is logged twice, and
params only once (the first attempt's values; MLflow refuses to change a param).

MLflow's client owns the HTTP calls and their retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES and friends);
mlflow is imported inside the functions, so importing this module costs nothing.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ...formats.run_folder import RunFolder
from ...formats.run_result import RunResult
from ...store.base import ObjectNotFound
from . import measurements
from .measurements import Measurement
from .params import flatten_params
from ..remediation import remedy_words
from .settings import TrackingSettings, tracking_env

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

log = logging.getLogger(__name__)

TAG_RUN_KEY = "ringflow.run_key"
TAG_RUN_URI = "ringflow.run_uri"
TAG_VERDICT = "ringflow.verdict"
TAG_STATUS = "ringflow.status"
TAG_HEALTH_SEQ = "ringflow.health_seq_logged"
TAG_REMEDIATED = "ringflow.remediated"
TAG_REMEDIES = "ringflow.remedies"
# MLflow keeps a tag's value up to 8000 characters (mlflow/utils/validation.py, MAX_TAG_VAL_LENGTH).
MAX_TAG_CHARS = 8000
# MLflow's per-request limits for log_batch (mlflow/utils/validation.py).
MAX_METRICS_PER_BATCH, MAX_PARAMS_PER_BATCH, MAX_TAGS_PER_BATCH = 1000, 100, 100


def run_key(run_uri: str) -> str:
    return hashlib.sha256(run_uri.rstrip("/").encode()).hexdigest()[:32]


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def client_for(settings: TrackingSettings) -> "MlflowClient":
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=settings.uri, registry_uri=settings.uri)


def experiment_id(client: "MlflowClient", name: str) -> str:
    """The experiment `name`, created if missing (a concurrent creation by another task is fine)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def find_run(client: "MlflowClient", experiment: str, run_uri: str) -> "Run | None":
    """The MLflow run of the run folder `run_uri` in `experiment`, if one was logged."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], filter_string=f"tags.`{TAG_RUN_KEY}` = '{run_key(run_uri)}'",
                              max_results=1, order_by=["attributes.start_time ASC"])
    return runs[0] if runs else None


def ensure_run(client: "MlflowClient", experiment: str, run_uri: str, run_name: str | None = None,
               tags: Mapping[str, str] | None = None) -> "Run":
    """The run folder's MLflow run, created (with `tags`) the first time a task logs into it."""
    run = find_run(client, experiment, run_uri)
    if run is not None:
        return run
    all_tags = {**(tags or {}), TAG_RUN_KEY: run_key(run_uri), TAG_RUN_URI: run_uri}
    return client.create_run(experiment_id(client, experiment), run_name=run_name, tags=all_tags)


def log_measurements(client: "MlflowClient", run_id: str, items: Sequence[Measurement],
                     tags: Mapping[str, str] | None = None) -> None:
    """The measurements and `tags`, in as few requests as MLflow's batch limits allow."""
    from mlflow.entities import Metric, RunTag

    metrics = [Metric(m.key, m.value, m.timestamp_ms, m.step) for m in items]
    run_tags = [RunTag(k, v) for k, v in (tags or {}).items()]
    metric_parts = chunks(metrics, MAX_METRICS_PER_BATCH) or [[]]
    tag_parts = chunks(run_tags, MAX_TAGS_PER_BATCH) or [[]]
    for part in metric_parts[:-1]:
        client.log_batch(run_id, metrics=list(part))
    # the tags with the last metrics: a tag that counts what was logged is written with the last of it
    client.log_batch(run_id, metrics=list(metric_parts[-1]), tags=list(tag_parts[0]))
    for part in tag_parts[1:]:
        client.log_batch(run_id, tags=list(part))


def log_params(client: "MlflowClient", run: "Run", params: Mapping[str, str]) -> list[str]:
    """Params the run does not have yet; returns the keys whose value differs from the one logged first."""
    from mlflow.entities import Param

    logged = run.data.params
    new = [Param(k, v) for k, v in params.items() if k not in logged]
    for part in chunks(new, MAX_PARAMS_PER_BATCH):
        client.log_batch(run.info.run_id, params=list(part))
    return sorted(k for k, v in params.items() if k in logged and logged[k] != v)


def log_files(client: "MlflowClient", run_id: str, run_folder: RunFolder, keys: Sequence[str]) -> list[str]:
    """The run folder's files `keys` (those that exist) as artifacts at the root of the MLflow run."""
    logged = []
    with tempfile.TemporaryDirectory(prefix="ringflow-mlflow-") as tmp:
        for key in keys:
            path = os.path.join(tmp, os.path.basename(key))
            try:
                run_folder.store.get_file(key, path)
            except ObjectNotFound:
                continue
            client.log_artifact(run_id, path)
            logged.append(key)
    return logged


def records_after(seq: int, run_folder: RunFolder,
                  every_record: Sequence[Mapping[str, Any]] | None) -> tuple[list[Mapping[str, Any]], int]:
    """The health records after `seq` and the last seq among them (`seq` when none is newer): picked from
    `every_record` when given, else read from the run folder (only what lies past `seq`)."""
    if every_record is None:
        newer = run_folder.records_after(seq)
        return newer, newer[-1]["seq"] if newer else seq
    newer = [r for r in every_record if isinstance(r.get("seq"), int) and r["seq"] > seq]
    return newer, newer[-1]["seq"] if newer else seq


def remedy_tags(job_config: Mapping[str, Any] | None) -> dict[str, str]:
    """What the retries changed before this attempt (the config's `remedies`), as tags: params never change
    after the first attempt, tags do. `ringflow.remediated` is "true"/"false"; `ringflow.remedies` lists them."""
    remedies = list((job_config or {}).get("remedies") or ())
    tags = {TAG_REMEDIATED: "true" if remedies else "false"}
    if remedies:
        tags[TAG_REMEDIES] = "; ".join(f"{remedy_words(r)}: {r.get('words', '')}" for r in remedies)[:MAX_TAG_CHARS]
    return tags


def log_training_run(settings: TrackingSettings, *, experiment: str, run_uri: str, run_folder: RunFolder,
                     job_config: Mapping[str, Any] | None, result: RunResult | None, run_name: str | None = None,
                     tags: Mapping[str, str] | None = None,
                     health_records: Sequence[Mapping[str, Any]] | None = None) -> str:
    """Log a finished attempt of the training job in `run_folder` (whatever its outcome; `result` None: it
    wrote no result.json). Returns the MLflow run id.

    health_records: all of the run's records when the caller has read them already (read_health); None:
    only the records past those an earlier attempt logged are read here."""
    with tracking_env(settings):
        client = client_for(settings)
        run = ensure_run(client, experiment, run_uri, run_name, tags)
        run_id = run.info.run_id
        if job_config is not None:
            changed = log_params(client, run, flatten_params(job_config))
            if changed:
                log.warning("MLflow run %s keeps the first attempt's params %s (MLflow params never change); "
                            "this attempt's values are in its job config", run_id, changed)
        logged_up_to = int(run.data.tags.get(TAG_HEALTH_SEQ, -1))
        records, last_seq = records_after(logged_up_to, run_folder, health_records)
        now_ms = int(time.time() * 1000)
        items = measurements.from_health_records(records)
        if result is not None:
            items += measurements.from_result(result, now_ms)
        verdict = result.verdict.status if result is not None and result.verdict else "NONE"
        status = result.status if result is not None else "no result"
        # The seq tag goes with the metrics it counts: after a lost request a retry logs them again, never skips.
        log_measurements(client, run_id, items, {
            TAG_HEALTH_SEQ: str(last_seq), TAG_VERDICT: verdict, TAG_STATUS: status,
            **({"ringflow.attempt": result.attempt} if result and result.attempt else {}),
            **({"ringflow.checkpoint": result.checkpoint} if result and result.checkpoint else {}),
            **remedy_tags(job_config),
            **(tags or {})})
        files = log_files(client, run_id, run_folder, run_folder.training_files())
        client.set_terminated(run_id, "FINISHED" if result is not None and result.succeeded else "FAILED")
    log.info("MLflow run %s (experiment %r): %d measurements from %d health records, verdict %s, artifacts %s",
             run_id, experiment, len(items), len(records), verdict, files)
    return run_id


def log_evaluation(settings: TrackingSettings, *, experiment: str, run_uri: str, run_folder: RunFolder,
                   eval_doc: Mapping[str, Any]) -> str:
    """eval.json's metrics (eval/<name> at the scored checkpoint's step) and the file itself."""
    with tracking_env(settings):
        client = client_for(settings)
        run_id = ensure_run(client, experiment, run_uri).info.run_id
        log_measurements(client, run_id, measurements.from_eval(eval_doc, int(time.time() * 1000)))
        log_files(client, run_id, run_folder, run_folder.evaluation_files())
    return run_id
