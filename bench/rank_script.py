"""ringflow's own launch command (launcher.launch_command: horovodrun or torchrun, its settings) with each
rank running a bench module instead of `python -m ringflow.training CONFIG`, so the module measures a rank
started exactly as ringflow starts one (loop_vs_plain.py, health_overhead.py, checkpoint_overhead.py,
gpu_check.py). Run it with an environment from common.importable(), so the ranks find the bench package."""
from __future__ import annotations

from typing import Any, Callable, Sequence


def rank_script_command(engine: str, config_path: str, num_workers: int, module: str,
                        module_args: Sequence[str]) -> list[str]:
    """module: the bench module each rank runs, e.g. "bench.loop_vs_plain" (`__spec__.name` for one's own)."""
    from ringflow.training.core.launcher import launch_command

    command = launch_command(engine, config_path, num_workers)
    # The last `-m` is followed by ringflow.training (horovodrun's ranks; torchrun's forked ranks run
    # `rank/forked_rank.py -m ringflow.training CONFIG`, and the launcher's own `-m` comes first).
    last_m = len(command) - 1 - command[::-1].index("-m")
    return command[:last_m + 1] + [module, *module_args]


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
