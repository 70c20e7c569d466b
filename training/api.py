"""The training API for a user's own script run by ringflow (the job config's `entry`), in the spirit of
`ray.train`. Every part is optional: a script that calls none of it still gets its ranks, liveness and a result.

    import ringflow.training.api as ringflow

    ctx = ringflow.get_context()                    # rank, world_size, local_rank, device, run_uri, config
    state = ringflow.get_checkpoint()               # the newest published checkpoint's state, or None
    shard = ringflow.get_dataset_shard()            # this rank's deal of the sharded dataset (resumes exactly)
    for epoch in shard.epochs():
        for x, y in shard:
            ...                                     # the script's own step
            ringflow.report({"loss": loss.item()},  # every rank, every step: a heartbeat, the loss checked
                            checkpoint={"model": model.state_dict(), "optimizer": opt.state_dict()})
    ringflow.report_eval({"accuracy": acc})         # rank 0's metrics on the eval split: the run's eval.json

- report(metrics, checkpoint=None): call it on every rank, once per step, the same number of times (it gathers a
  health row across ranks every health.every_steps when the script's process group or Horovod is up). A
  checkpoint (a dict of tensors/arrays/numbers, as state_dict() gives) is written by rank 0 in the background
  when the config's cadence says one is due (checkpoint.every_steps, checkpoint.min_interval_seconds), fenced and
  verified as ringflow's own; the last one handed over is the final checkpoint. A NaN/Inf "loss" stops the run
  with a NONFINITE verdict.
- get_checkpoint(): loaded safely (torch's weights_only loader, or numpy without pickle); None on a fresh run.
- get_dataset_shard(format="torch"|"numpy"|"tensorflow"): the same global stream, order and cursor as
  ringflow's loop; the cursor is saved in every checkpoint, so a resume, on any number of workers, trains on
  every row of the epoch exactly once. A script with its own data loading resumes as exactly as it makes it.
- get_eval_data(format=None): the manifest's held-out split as (x, y), the whole of it on every rank.

Outside a ringflow job (the script run by hand) every call still works: a context of one worker, no checkpoint,
reports printed, so the same script runs under plain torchrun too.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

_run = None  # the rank's ScriptRun while the script runs (rank/script_rank.py)


def _serve(run) -> None:
    global _run
    _run = run


def in_job() -> bool:
    """Whether ringflow is running this script (else the calls below act for a standalone run)."""
    return _run is not None


def get_context():
    """This worker's place in the job (rank/script_context.py's Context)."""
    if _run is None:
        return _standalone_context()
    return _run.context()


def get_checkpoint() -> Any:
    """The state of the newest published checkpoint of this run, or None (a fresh run)."""
    return None if _run is None else _run.checkpoint()


def get_dataset_shard(split: str = "train", format: str | None = None):  # noqa: A002 - ray.train's word
    """This rank's batches of the run's sharded dataset (rank/script_data.py's DatasetShard)."""
    if _run is None:
        raise RuntimeError("get_dataset_shard() needs a ringflow job (the dataset comes from its manifest): run "
                           "the script with `ringflow train CONFIG` or the train operator")
    return _run.dataset_shard(split, format)


def get_eval_data(format: str | None = None):  # noqa: A002
    """The manifest's eval split as (x, y), whole, in `format` (torch tensors or numpy arrays)."""
    if _run is None:
        raise RuntimeError("get_eval_data() needs a ringflow job: run the script with `ringflow train CONFIG`")
    return _run.eval_data(format)


def report(metrics: Mapping[str, Any], checkpoint: Any = None) -> None:
    """One step's metrics (a "loss" is checked for NaN/Inf), and optionally the state to checkpoint."""
    if _run is None:
        print(f"[ringflow] report (standalone): {dict(metrics)}", flush=True)
        return
    _run.report(metrics, checkpoint)


def report_eval(metrics: Mapping[str, Any]) -> None:
    """The model's metrics on the eval split (rank 0's count): they become the run's eval.json, which the
    promotion gate reads."""
    if _run is None:
        print(f"[ringflow] eval (standalone): {dict(metrics)}", flush=True)
        return
    _run.report_eval(metrics)


def _standalone_context():
    from .rank.script_context import Context
    from .rank.worker_env import launcher_local_rank, launcher_rank, launcher_world_size

    return Context(rank=launcher_rank(os.environ) or 0, world_size=launcher_world_size(os.environ) or 1,
                   local_rank=launcher_local_rank(os.environ), device="cpu", run_uri="", attempt="", engine="",
                   config=None, code_dir=None, resumed_from=None)
