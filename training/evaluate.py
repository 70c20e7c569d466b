"""Score a run's final checkpoint on the held-out split; write `eval.json` beside the run (EvalResult).

`evaluate` is the step as the Airflow operator and `ringflow evaluate` run it: with the S3 settings of the
caller (the operator's Airflow connection; the environment's, on a shell) set only for the call.
"""
from __future__ import annotations

import contextlib
import time
import urllib.parse
from typing import Any, Callable, Iterator

import torch

from ringflow.training.run_folder import RunFolder
from ringflow.training.config import ModelConfig
from ringflow.training.core.run_reader import RunNotReady
from ringflow.training.data import to_tensors
from ringflow.training.manifest import ManifestError
from ringflow.training.models import build_model
from ringflow.training.sharding import read_partition
from ringflow.training.store import open_store
from ringflow.training.run_result import read_result
from ringflow.training.manifest import load_manifest
from ringflow.training import run_layout
from ringflow.training.formats.eval_result import EvalResult, write_eval
from ringflow.training.runs import store_layout
from ringflow.training.scoped_environ import scoped_environ
from ringflow.training.store.s3 import S3Settings
from ringflow.training.training_state import STATE_FILE, TrainingState


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


def evaluate_run(run_uri: str, checkpoint: str | None = None) -> EvalResult:
    """Metrics of `checkpoint` (default: the one result.json names) on the manifest's eval split."""
    run_folder = open_store(run_uri)
    checkpoints = RunFolder(run_folder).checkpoints()  # the published ones (run_folder.py)
    if checkpoint is None:
        result = read_result(run_folder)
        if result is None:
            raise RunNotReady(f"{run_folder.uri}: the run has published no result (result.json); "
                              "train it first or name a checkpoint")
        if not result.succeeded:
            raise RunNotReady(f"{run_uri}: the run {result.status} (attempt {result.attempt}) and has no final "
                             "checkpoint; evaluate a checkpoint by name or train it again")
        checkpoint = result.checkpoint
    loaded = checkpoints.load(checkpoint)
    meta = loaded.manifest.meta
    manifest, shard_store = load_manifest(meta["manifest_uri"])
    if manifest.eval is None:
        raise ManifestError("the shards have no eval split: shard with eval_fraction > 0 to evaluate")
    model_cfg = dict(meta["model"])
    model_cfg["hidden"] = tuple(model_cfg.get("hidden", ()))
    schema = meta["schema"]
    model, _ = build_model(ModelConfig(**model_cfg), schema["num_features"], schema["num_outputs"], schema["task"],
                           input_shape=schema.get("input_shape"))
    state = TrainingState.from_bytes(loaded.files[STATE_FILE], f"{run_uri} {checkpoint}/{STATE_FILE}")
    model.load_state_dict(state.model)
    model.eval()
    x, y = to_tensors(read_partition(shard_store, manifest.eval), manifest.schema)
    with torch.no_grad():
        metrics = metrics_for(schema["task"], model(x), y)
    result = EvalResult(metrics=metrics, checkpoint=checkpoint, step=loaded.manifest.step, rows=len(x),
                        task=schema["task"], evaluated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    write_eval(run_folder, result)
    return result


@contextlib.contextmanager
def s3_env_for(uri: str, settings: Callable[[], S3Settings] | None) -> Iterator[None]:
    """Within the block, the process environment carries `settings()` if `uri` is on S3 (the training code
    reads its S3 settings from there); the previous values come back afterwards, so no credential outlives
    the call. settings None, or a local `uri`: the environment stays as it is (and settings is not asked)."""
    if urllib.parse.urlsplit(uri).scheme != "s3" or settings is None:
        yield
        return
    with scoped_environ(settings().to_env()):
        yield


def evaluate(run_uri: str, checkpoint: str | None = None,
             s3_settings: Callable[[], S3Settings] | None = None) -> dict[str, Any]:
    """evaluate_run with `s3_settings` for the call; eval.json's document plus where it is."""
    with s3_env_for(run_uri, s3_settings):
        result = evaluate_run(run_uri, checkpoint)
    return {**result.to_dict(), "run_uri": run_uri, "eval_uri": store_layout.join(run_uri, run_layout.EVAL)}
