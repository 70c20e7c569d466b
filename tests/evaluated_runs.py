"""Run folders as the train and evaluate steps leave them, made in one process (no Horovod): an evaluated run
(checkpoint, result.json, eval.json) for promote, its approval and `ringflow promote`, and a really trained
one (a model's checkpoint with its meta, result.json) for evaluate and `ringflow evaluate`."""
from __future__ import annotations

from ringflow.training.formats.eval_result import EvalResult
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.health.verdict import Verdict
from ringflow.training.formats.run_result import RunResult
from run_folder_files import publish_checkpoint


def make_run(store, run_id, accuracy, *, status="succeeded", verdict="HEALTHY", step=40):
    """runs/<run_id> in `store`: a checkpoint, its result and an evaluation with this accuracy."""
    run = store.child(f"runs/{run_id}")
    attempt = RunFolder(run).claim(f"{run_id}-a1")
    ckpt = publish_checkpoint(attempt, step, {"state.pt": f"weights of {run_id}".encode()}, {})
    attempt.publish_result(RunResult(status=status, attempt=attempt.ref.id, step=step, epoch=1, world_size=2,
                                     checkpoint=ckpt if status == "succeeded" else None,
                                     verdict=Verdict(verdict, "as judged") if verdict else None).to_json())
    RunFolder(run).write_eval(EvalResult(metrics={"accuracy": accuracy, "loss": 1 - accuracy}, checkpoint=ckpt, step=step,
                                          rows=100, task="classification", evaluated_at="2026-01-01T00:00:00Z"))
    return run_id


def make_trained_run(run_folder, manifest_uri: str, steps: int, s3=None) -> str:
    """Train the default MLP for `steps` full-batch steps on partition 0 and save it as the final checkpoint
    (s3: the S3 settings the shards are read with)."""
    import torch

    from ringflow.training.formats.config import ModelConfig
    from ringflow.training.rank.data import to_tensors
    from ringflow.training.formats.manifest import load_manifest
    from ringflow.training.rank.models import build_model
    from ringflow.training.core.sharding import read_partition
    from ringflow.training.rank.training_state import STATE_FILE, TrainingState

    manifest, shard_store = load_manifest(manifest_uri, s3=s3)
    schema = manifest.schema
    torch.manual_seed(0)
    model, loss_fn = build_model(ModelConfig(), len(schema.features), schema.num_outputs, schema.task)
    x, y = to_tensors(read_partition(shard_store, manifest.partitions[0]), schema)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    state = TrainingState(model=model.state_dict(), optimizer=optimizer.state_dict(), cursor=(1, 0), step=steps,
                          torch_rng=torch.get_rng_state())
    meta = {"step": steps, "manifest_uri": manifest_uri, "model": {"kind": "mlp", "hidden": [64, 64], "dropout": 0.0,
                                                                   "factory": None, "kwargs": {}},
            "schema": {"num_features": len(schema.features), "num_outputs": schema.num_outputs, "task": schema.task}}
    attempt = RunFolder(run_folder).claim("a1")
    name = publish_checkpoint(attempt, steps, {STATE_FILE: state.to_bytes()}, meta)
    attempt.publish_result(RunResult(status="succeeded", attempt="a1", step=steps, epoch=1, world_size=1,
                                     checkpoint=name).to_json())
    return name


def make_script_run(run_folder, manifest_uri: str, eval_metrics=None, *, seed: int = 0):
    """A user script's run as its ranks leave it (rank/script_rank.py): a final checkpoint holding the state
    the script handed to report(checkpoint=...) as script_state.pt, its meta naming the script, its bundle and,
    when given, the metrics it reported with report_eval; result.json naming the script. (its model, the
    checkpoint's name)"""
    import io

    import torch

    from ringflow.training.formats.script_checkpoint import BUNDLE_META, EVAL_META, SCRIPT_META, TORCH_FILE

    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 10)
    state = io.BytesIO()
    torch.save({"model": model.state_dict(), "epoch": 3}, state)
    meta = {"step": 90, "epoch": 3, "engine": "ddp", "manifest_uri": manifest_uri, SCRIPT_META: "train.py",
            BUNDLE_META: "ab" * 32, "metrics": {"loss": 0.3}, "final": True}
    if eval_metrics is not None:
        meta[EVAL_META] = eval_metrics
    attempt = RunFolder(run_folder).claim("a1")
    name = publish_checkpoint(attempt, 90, {TORCH_FILE: state.getvalue()}, meta)
    attempt.publish_result(RunResult(status="succeeded", attempt="a1", step=90, epoch=3, world_size=2, checkpoint=name,
                                     verdict=Verdict("HEALTHY", "as judged"), script="train.py",
                                     metrics={"loss": 0.3}).to_json())
    return model, name
