"""Score a run's final checkpoint on the held-out split; write `eval.json` beside the run (EvalResult).

A user script's run (its checkpoint's meta names the "script": the job config's entry) is not scored with
ringflow's model, which is not the script's: its eval.json holds the metrics the script itself reported on the
manifest's eval split (ringflow.training.api.report_eval, kept in the final checkpoint's meta as
"eval_metrics"), and the gate, registry, approval and rollback read it as any other.

`evaluate_run` is the step on an open RunFolder (the Airflow operator opens it with its connection's S3
settings); `evaluate` opens it from a URI, as `ringflow evaluate` does. The shards the checkpoint names are read
with the run folder's own S3 settings: nothing is put in the process environment.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from ..formats.run_folder import RunFolder
from ..formats.config import ModelConfig
from .run_reader import RunNotReady
from ..rank.data import to_tensors
from ..formats.manifest import ManifestError
from ..rank.models import build_model
from .sharding import read_partition
from ..formats.manifest import load_manifest
from ..rank.training_state import STATE_FILE, TrainingState
from ..formats.script_checkpoint import EVAL_META, SCRIPT_META
from ..formats.eval_result import EvalResult
from ..formats.checkpoint import CheckpointCorrupt, CheckpointManifest
from ..formats.weights_npz import MODEL_FILE, from_npz
from ..store.s3 import S3Settings

NO_EVAL_SPLIT = "the shards have no eval split: shard with eval_fraction > 0 to evaluate"


def metrics_for(task: str, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    if task == "classification":
        loss = torch.nn.functional.cross_entropy(outputs, targets)
        accuracy = (outputs.argmax(dim=1) == targets).double().mean()
        return {"accuracy": float(accuracy), "loss": float(loss)}
    pred = outputs.squeeze(-1)
    mse = torch.mean((pred - targets) ** 2)
    variance = torch.var(targets, unbiased=False)
    return {"mse": float(mse), "mae": float(torch.mean(torch.abs(pred - targets))),
            "r2": float(1 - mse / variance) if variance > 0 else 0.0, "loss": float(mse)}


def model_weights(files: dict[str, bytes], where: str) -> dict[str, torch.Tensor]:
    """The checkpoint's model state_dict: a torch engine's state.pt, or the TensorFlow engine's model.npz
    (its parameters under torch's names and layouts, formats/weights_npz.py), so one torch module evaluates
    every engine's runs. strict loading then refuses one that does not match the model its meta names."""
    if STATE_FILE in files:
        return TrainingState.from_bytes(files[STATE_FILE], f"{where}/{STATE_FILE}").model
    if MODEL_FILE in files:
        return {name: torch.from_numpy(array) for name, array in from_npz(files[MODEL_FILE], f"{where}/{MODEL_FILE}").items()}
    raise CheckpointCorrupt(f"{where} holds neither {STATE_FILE} nor {MODEL_FILE} (files {sorted(files)}): it is "
                            "not a ringflow checkpoint of a model; evaluate another checkpoint")


def evaluate_run(run: RunFolder, checkpoint: str | None = None) -> EvalResult:
    """Metrics of `checkpoint` (default: the one the published result names) on the manifest's eval split,
    written to the run folder's eval.json (RunFolder.write_eval); the shards are read with the run folder's
    own S3 settings."""
    checkpoints = run.checkpoints()  # the published ones (run_folder.py)
    if checkpoint is None:
        result = run.read_result()
        if result is None:
            raise RunNotReady(f"{run.uri}: the run has published no result (result.json); "
                              "train it first or name a checkpoint")
        if not result.succeeded:
            raise RunNotReady(f"{run.uri}: the run {result.status} (attempt {result.attempt}) and has no final "
                              "checkpoint; evaluate a checkpoint by name or train it again")
        checkpoint = result.checkpoint
    head = checkpoints.read_manifest(checkpoint)
    if SCRIPT_META in head.meta:  # a user script's run: its own metrics, not ringflow's model's
        result = script_evaluation(run, head)
        run.write_eval(result)
        return result
    loaded = checkpoints.load(checkpoint)
    meta = loaded.manifest.meta
    manifest, shard_store = load_manifest(meta["manifest_uri"], s3=run.s3)
    if manifest.eval is None:
        raise ManifestError(NO_EVAL_SPLIT)
    model_cfg = dict(meta["model"])
    model_cfg["hidden"] = tuple(model_cfg.get("hidden", ()))
    schema = meta["schema"]
    model, _ = build_model(ModelConfig(**model_cfg), schema["num_features"], schema["num_outputs"], schema["task"],
                           input_shape=schema.get("input_shape"))
    model.load_state_dict(model_weights(loaded.files, f"{run.uri} {checkpoint}"))
    model.eval()
    x, y = to_tensors(read_partition(shard_store, manifest.eval), manifest.schema)
    with torch.no_grad():
        metrics = metrics_for(schema["task"], model(x), y)
    result = EvalResult(metrics=metrics, checkpoint=checkpoint, step=loaded.manifest.step, rows=len(x),
                        task=schema["task"], evaluated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    run.write_eval(result)
    return result


def script_evaluation(run: RunFolder, checkpoint: CheckpointManifest) -> EvalResult:
    """The evaluation a script run's final checkpoint carries: the metrics the script reported on the manifest's
    eval split (its meta's "eval_metrics"); RunNotReady, in one line, when the script reported none."""
    meta = checkpoint.meta
    metrics = meta.get(EVAL_META)
    if not metrics:
        raise RunNotReady(f"{run.uri} {checkpoint.name}: the script {meta[SCRIPT_META]!r} reported no eval metrics; "
                          "call ringflow.training.api.report_eval({...}) on rank 0 after training, with its "
                          "model's metrics on ringflow.training.api.get_eval_data() (e.g. accuracy, loss), and "
                          "train again")
    manifest, _ = load_manifest(meta["manifest_uri"], s3=run.s3)
    if manifest.eval is None:
        raise ManifestError(NO_EVAL_SPLIT)
    return EvalResult(metrics=metrics, checkpoint=checkpoint.name, step=checkpoint.step, rows=manifest.eval.rows,
                      task=manifest.schema.task, evaluated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def evaluate(run_uri: str, checkpoint: str | None = None, s3: S3Settings | None = None) -> dict[str, Any]:
    """evaluate_run on the run folder at `run_uri`, opened with `s3` (None: the environment's S3 settings, as
    `ringflow evaluate` has them); eval.json's document plus where it is."""
    run = RunFolder.open(run_uri, s3)
    return {**evaluate_run(run, checkpoint).to_dict(), "run_uri": run_uri, "eval_uri": run.eval_uri}
