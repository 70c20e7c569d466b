"""ringflow's own launch command (launcher.launch_command: horovodrun or torchrun, its settings) with each
rank running a benchmark script instead of `python -m ringflow.training CONFIG`, so the script measures a
rank started exactly as ringflow starts one (loop_vs_plain.py, gpu_check.py)."""
from __future__ import annotations

from typing import Sequence


def rank_script_command(engine: str, config_path: str, num_workers: int, script: str,
                        script_args: Sequence[str]) -> list[str]:
    from ringflow.training.launcher import launch_command

    command = launch_command(engine, config_path, num_workers)
    # The last `-m`: torchrun's own `-m torch.distributed.run` comes first.
    last_m = len(command) - 1 - command[::-1].index("-m")
    return command[:last_m] + [script, *script_args]
