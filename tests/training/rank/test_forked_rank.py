"""A local DDP rank forked from torchrun's process (rank/forked_rank.py, run by torchrun's --run-path in the fork):
it runs `-m MODULE` or a script as python would, with what a new interpreter has (default signal handlers, no
multiprocessing start method chosen), and hands its exit code back after finishing as an interpreter does."""
from __future__ import annotations

import multiprocessing
import runpy
import signal
import sys

import pytest

from ringflow.training.core.launcher import FORKED_RANK

RANK = """
import atexit, multiprocessing, signal, sys

def note(line):
    with open({said!r}, "a") as out:
        out.write(line + "\\n")

atexit.register(note, "the rank's exit handler")
note("SIGTERM default: " + str(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL))
multiprocessing.set_start_method("spawn")  # as a script may
note("start method: " + multiprocessing.get_start_method())
{ending}
"""


def forked(argv: list[str]) -> None:
    """The forked process, as torchrun's run_script_path runs forked_rank.py in it."""
    sys.argv = [str(FORKED_RANK), *argv]
    runpy.run_path(str(FORKED_RANK), run_name="__main__")


def raising_handler(signum, frame):
    raise RuntimeError("torchrun's handler")


@pytest.mark.job  # a forked process
@pytest.mark.parametrize("ending, code, says", [
    ("", 0, None),
    ("sys.exit(7)", 7, None),
    ("raise ValueError('bad input in the script')", 1, "ValueError: bad input in the script"),
    # a rank that ran a user's script leaves through process_exit.leave: in a fork, its code comes back here
    ("from ringflow.training.rank.process_exit import leave; leave(5)", 5, None),
])
def test_a_forked_rank_runs_as_a_new_interpreter_and_hands_back_its_code(tmp_path, monkeypatch, capfd, ending, code,
                                                                           says):
    said = tmp_path / "said.txt"
    (tmp_path / "rank_module.py").write_text(RANK.format(said=str(said), ending=ending))
    monkeypatch.syspath_prepend(str(tmp_path))
    before = signal.signal(signal.SIGTERM, raising_handler)  # what torchrun's process holds when it forks
    try:
        child = multiprocessing.get_context("fork").Process(target=forked, args=(["-m", "rank_module"],))
        child.start()
        child.join(60)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert child.exitcode == code
    assert said.read_text().splitlines() == ["SIGTERM default: True", "start method: spawn", "the rank's exit handler"]
    if says:
        err = capfd.readouterr().err
        assert "Traceback" in err and says in err, err
