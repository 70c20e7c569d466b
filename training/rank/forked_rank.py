"""One rank of a local DDP job, as the file torchrun runs in each process it forks (forked_torchrun.py,
`--run-path`): `python -m ringflow.training CONFIG`'s entry point, with its arguments and exit code.

It leaves the way a rank's own interpreter would, within torchrun's fork: the exit handlers it registered run
(a user's script's among them, MLflow's end of run for one), torchrun's inherited ones do not, and it returns
its code to torchrun rather than leaving the process itself (rank/process_exit.py: a forked process has no
interpreter teardown to skip, and torchrun waits for a forked rank's return).
"""
import atexit
import sys

from ringflow.training.__main__ import main

if __name__ == "__main__":
    atexit._clear()  # torchrun's own handlers, inherited through the fork: not this rank's to run
    try:
        code = main()
    finally:
        atexit._run_exitfuncs()
    sys.exit(code)
