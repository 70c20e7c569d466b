"""`python -m ringflow.training CONFIG`: the per-rank entry point that horovodrun/mpirun start."""
from __future__ import annotations

import argparse
import os
import sys

from .formats import exit_codes
from .formats.config import ConfigError, load_job_config


def job_config(text: str) -> str:
    """A job config that is there: a file (a path or file:// URI), or an s3:// URI (read, and checked, below)."""
    path = text[len("file://"):] if text.startswith("file://") else text
    if not text.startswith("s3://") and not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file: give the job config's path, file:// or s3:// URI")
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ringflow.training",
                                description="one training rank, as a launcher starts it (horovodrun, torchrun, "
                                            "ringflow's TF_CONFIG workers, a cluster job's pods)")
    p.add_argument("config", type=job_config, help="the job config JSON (path, file:// or s3://)")
    return p


def main(argv: list[str] | None = None, leave_when_done: bool = False) -> int:
    """The rank's exit code. leave_when_done: a rank that ran the user's script leaves the process without
    the interpreter's finalization (rank/process_exit.py); the entry point's, not a caller's in-process."""
    args = parser().parse_args(argv)  # a bad argument: usage and one error line, exit 2 (exit_codes.CONFIG)
    try:
        cfg = load_job_config(args.config)
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

        try:
            code = run_script(cfg, engine)
        except BaseException as exc:  # a traceback as Python prints it, then the same way out
            if not leave_when_done:
                raise
            code = exit_code_of(exc)
        if leave_when_done:
            from .rank.process_exit import leave

            leave(code)
        return code
    if engine_spec(engine).starts_workers_itself:
        from .rank.tensorflow_worker import main as run_worker
    else:
        from .rank.worker import main as run_worker

    return run_worker(cfg)


def exit_code_of(exc: BaseException) -> int:
    """The exit code Python gives an uncaught `exc`, its traceback printed as Python prints it."""
    if isinstance(exc, SystemExit):
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    import traceback

    traceback.print_exception(exc)
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


if __name__ == "__main__":
    sys.exit(main(leave_when_done=True))
