"""`python -m ringflow.training CONFIG`: the per-rank entry point that horovodrun/mpirun start."""
from __future__ import annotations

import os
import sys

from .formats import exit_codes
from .formats.config import ConfigError, load_job_config


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ringflow.training JOB_CONFIG(.json | file:// | s3://)", file=sys.stderr)
        return exit_codes.CONFIG
    try:
        cfg = load_job_config(argv[0])
    except ConfigError as exc:
        print(f"[ringflow] {exc}", file=sys.stderr)
        return exit_codes.CONFIG
    # The engine's ranks: torch's (worker.py) or TensorFlow's (tensorflow_worker.py, in the TF venv, which
    # has no torch), the one its launcher was started for (rank/engines: ENGINE_ENV), else the config's.
    from .formats.engines import engine_spec
    from .rank.engines import ENGINE_ENV, engine_name

    try:
        engine = engine_name(cfg, os.environ.get(ENGINE_ENV))
    except ConfigError as exc:
        print(f"[ringflow] {exc}", file=sys.stderr)
        return exit_codes.CONFIG
    if cfg.entry is not None:  # the user's own code, whatever the engine (its launcher started this rank)
        from .rank.script_rank import main as run_script

        return run_script(cfg, engine)
    if engine_spec(engine).starts_workers_itself:
        from .rank.tensorflow_worker import main as run_worker
    else:
        from .rank.worker import main as run_worker

    return run_worker(cfg)


if __name__ == "__main__":
    sys.exit(main())
