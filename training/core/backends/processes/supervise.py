"""The process a local job runs under: `python -m ringflow.training.core.backends.processes.supervise --job-dir DIR
[--tracking MODE] [--grace S] -- COMMAND...`.

It starts COMMAND inside a new tracked set (tracking.py) and writes, in DIR:
    processes.json  who it is (pid and start time) and the set's record, before COMMAND starts, so that the
                    backend, from any process, can find and stop every process of the job
    exit_code       COMMAND's exit status, as a shell reports it (128 + the signal that killed it), written
                    last: once every process of the job is gone or has been named as one that would not go
Its own messages go to stderr, which the backend points at the job's output.log: among them, the processes
still running after COMMAND ended, and how they were stopped.

SIGTERM, SIGINT or SIGHUP to it stop the whole set (stop.py); it stays until COMMAND has ended, so it is
never an orphan's missing parent (the subreaper fallback relies on that).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ringflow.training.formats import exit_codes
from . import proc
from .stop import (
    DEFAULT_GRACE_SECONDS, GRACE_ENV, stop_leftovers, stop_processes,
)
from .subreaper import reap_adopted
from .tracker import RELEASE_WAIT_SECONDS, TrackingUnavailable
from .tracking import AUTO, TRACKING_ENV, start_tracking

PROCESSES_FILE = "processes.json"
EXIT_CODE_FILE = "exit_code"
POLL_SECONDS = 0.2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def shell_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def write_json(path: Path, doc: Any) -> None:
    """Whole or not at all: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def write_exit_code(job_dir: Path, code: int) -> None:
    tmp = job_dir / (EXIT_CODE_FILE + ".tmp")
    tmp.write_text(f"{code}\n")
    os.replace(tmp, job_dir / EXIT_CODE_FILE)


def say(message: str) -> None:
    print(f"[ringflow] {message}", file=sys.stderr, flush=True)


def supervise(job_dir: Path, command: list[str], mode: str = AUTO,
              grace_seconds: float = DEFAULT_GRACE_SECONDS) -> int:
    requested: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: requested.append(signum))
    # A child ended: as a subreaper it may be an orphan handed to us, whose zombie only we can collect.
    children_ended: list[int] = []
    signal.signal(signal.SIGCHLD, lambda signum, _frame: children_ended.append(signum))
    try:
        tracker = start_tracking(job_dir.name, mode)
    except TrackingUnavailable as exc:
        say(f"error: {exc}")
        write_exit_code(job_dir, exit_codes.ERROR)
        return exit_codes.ERROR
    me = proc.read(os.getpid())
    assert me is not None
    with tracker:
        write_json(job_dir / PROCESSES_FILE,
                   {"supervisor": {"pid": me.pid, "start": me.start}, "tracking": tracker.record()})
        # The job's own launcher (`ringflow train`) tracks its ranks the same way, nested inside this set,
        # and stops them with the same grace period.
        env = os.environ | {TRACKING_ENV: mode, GRACE_ENV: str(grace_seconds)}
        try:
            child = tracker.spawn(command, env=env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            say(f"error: cannot start {command[0]}: {exc}")
            tracker.release()
            write_exit_code(job_dir, exit_codes.ERROR)
            return exit_codes.ERROR
        stopping = False
        while (returncode := child.poll()) is None:
            if requested and not stopping:
                stopping = True
                say(f"stop requested (signal {requested[0]}): stopping every process of the job")
                stop_processes(tracker, grace_seconds)
            if children_ended:
                children_ended.clear()
                reap_adopted(keep=child.pid)
            time.sleep(POLL_SECONDS)
        stop_leftovers(tracker, grace_seconds, say)
        tracker.release(RELEASE_WAIT_SECONDS)
    code = shell_status(returncode)
    write_exit_code(job_dir, code)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="supervise", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--tracking", default=AUTO)
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    return supervise(args.job_dir, args.command, args.tracking, args.grace)


if __name__ == "__main__":
    sys.exit(main())
