"""ringflow's own launch command (launcher.launch_command: horovodrun or torchrun, its settings) with each
rank running a benchmark script instead of `python -m ringflow.training CONFIG`, so the script measures a
rank started exactly as ringflow starts one (loop_vs_plain.py, health_overhead.py, checkpoint_overhead.py,
gpu_check.py)."""
from __future__ import annotations

from typing import Any, Callable, Sequence


def rank_script_command(engine: str, config_path: str, num_workers: int, script: str,
                        script_args: Sequence[str]) -> list[str]:
    from ringflow.training.core.launcher import launch_command

    command = launch_command(engine, config_path, num_workers)
    # The last `-m`: torchrun's own `-m torch.distributed.run` comes first.
    last_m = len(command) - 1 - command[::-1].index("-m")
    return command[:last_m] + [script, *script_args]


def train_and_report(trainer, engine, out: str, measured: Callable[[], Any]) -> None:
    """In a benchmark's rank: train with the Trainer, leave the engine's collectives however it ended, then
    rank 0 writes what the benchmark's callbacks measured (`measured()`, as JSON) to `out`."""
    import json
    from pathlib import Path

    try:
        if trainer.train() != 0:
            raise SystemExit("the training job failed")
    finally:
        engine.shutdown()
    if engine.rank == 0:
        Path(out).write_text(json.dumps(measured()))
