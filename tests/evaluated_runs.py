"""Run folders as the train and evaluate steps leave them (a checkpoint, result.json, eval.json), made in one
process for the tests of promote, its approval and `ringflow promote`."""
from __future__ import annotations

from ringflow.training.checkpoint import CheckpointStore
from ringflow.training.formats.eval_result import EvalResult, write_eval
from ringflow.training.health.verdict import Verdict
from ringflow.training.run_result import RunResult, write_result


def make_run(store, run_id, accuracy, *, status="succeeded", verdict="HEALTHY", step=40):
    """runs/<run_id> in `store`: a checkpoint, its result and an evaluation with this accuracy."""
    run = store.child(f"runs/{run_id}")
    ckpt = CheckpointStore(run).save(step, {"state.pt": f"weights of {run_id}".encode()}, {})
    write_result(run, RunResult(status=status, attempt=f"{run_id}-a1", step=step, epoch=1, world_size=2,
                                checkpoint=ckpt if status == "succeeded" else None,
                                verdict=Verdict(verdict, "as judged") if verdict else None))
    write_eval(run, EvalResult(metrics={"accuracy": accuracy, "loss": 1 - accuracy}, checkpoint=ckpt, step=step,
                               rows=100, task="classification", evaluated_at="2026-01-01T00:00:00Z"))
    return run_id
