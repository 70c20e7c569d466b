"""A rank of a local DDP job, in a process torchrun forked (forked_torchrun.py; torchrun's --run-path runs this
file there): `forked_rank.py -m MODULE ARGS...` or `forked_rank.py SCRIPT ARGS...`, run as `python` would run
them, `-m ringflow.training CONFIG` for ringflow's own rank.

The fork is not a new interpreter, so first it puts back what a new one would have: the default signal
handlers (torchrun's raise an exception in the main thread, so a SIGTERM would not end a rank blocked in a
collective, and a script's `except Exception` could swallow it) and no multiprocessing start method chosen
(multiprocessing fixes "fork" in the processes it starts: a script's set_start_method("spawn") would fail).
Then it ends as an interpreter does (process_exit.finish: threads joined, exit handlers run, streams flushed;
an uncaught exception's traceback printed by this rank itself) and returns the code to torchrun, which waits
for a forked rank's return.
"""
import multiprocessing
import runpy
import signal
import sys

from ringflow.training.__main__ import exit_code_of
from ringflow.training.rank.process_exit import finish


def as_a_new_process() -> None:
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    multiprocessing.set_start_method(None, force=True)


def run(argv: list[str]) -> int:
    """argv as python's own: ["-m", MODULE, *args] or [SCRIPT, *args]; the exit code python would give."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except BaseException as exc:  # noqa: BLE001 - as the interpreter would: SystemExit's code, else a traceback
        return exit_code_of(exc)


if __name__ == "__main__":
    as_a_new_process()
    code = run(sys.argv[1:])
    finish()
    sys.exit(code)
