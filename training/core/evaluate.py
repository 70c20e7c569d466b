"""Score a run's final checkpoint on the held-out split; write `eval.json` beside the run."""
from __future__ import annotations

import time

import torch

from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.formats.config import ModelConfig
from ringflow.training.rank.data import to_tensors
from ringflow.training.formats.manifest import ManifestError
from ringflow.training.rank.models import build_model
from ringflow.training.core.sharding import read_partition
from ringflow.training.store import ObjectNotFound
from ringflow.training.formats.manifest import load_manifest
from ringflow.training.rank.training_state import STATE_FILE, TrainingState



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


def evaluate_run(run: RunFolder, checkpoint: str | None = None) -> dict:
    """Metrics of `checkpoint` (default: the one the published result names) on the manifest's eval split,
    written to the run folder's eval.json (RunFolder.write_eval); the shards are read with the run folder's
    own S3 settings."""
    checkpoints = run.checkpoints()  # the published ones (run_folder.py)
    if checkpoint is None:
        result = run.read_result()
        if result is None:
            raise ObjectNotFound(f"{run.uri}: the run has published no result (result.json); "
                                 "train it first or name a checkpoint")
        if not result.succeeded:
            raise ValueError(f"{run.uri}: the run {result.status} (attempt {result.attempt}) and has no final "
                             "checkpoint; evaluate a checkpoint by name or train it again")
        checkpoint = result.checkpoint
    loaded = checkpoints.load(checkpoint)
    meta = loaded.manifest.meta
    manifest, shard_store = load_manifest(meta["manifest_uri"], s3=run.s3)
    if manifest.eval is None:
        raise ManifestError("the shards have no eval split: shard with eval_fraction > 0 to evaluate")
    model_cfg = dict(meta["model"])
    model_cfg["hidden"] = tuple(model_cfg.get("hidden", ()))
    schema = meta["schema"]
    model, _ = build_model(ModelConfig(**model_cfg), schema["num_features"], schema["num_outputs"], schema["task"],
                           input_shape=schema.get("input_shape"))
    state = TrainingState.from_bytes(loaded.files[STATE_FILE], f"{run.uri} {checkpoint}/{STATE_FILE}")
    model.load_state_dict(state.model)
    model.eval()
    x, y = to_tensors(read_partition(shard_store, manifest.eval), manifest.schema)
    with torch.no_grad():
        metrics = metrics_for(schema["task"], model(x), y)
    doc = {"metrics": metrics, "checkpoint": checkpoint, "step": loaded.manifest.step, "rows": len(x),
           "task": schema["task"], "evaluated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    run.write_eval(doc)
    return doc
