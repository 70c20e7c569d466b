"""`python -m ringflow.training CONFIG`: the per-rank entry point that horovodrun/mpirun start."""
from __future__ import annotations

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
    from .rank.worker import main as run_worker

    return run_worker(cfg)


if __name__ == "__main__":
    sys.exit(main())
