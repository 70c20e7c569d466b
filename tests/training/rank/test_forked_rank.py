"""A local DDP rank forked from torchrun's process (rank/forked_rank.py, run by torchrun's --run-path in the fork):
it returns the rank's exit code, runs the exit handlers the rank registered and not the ones it inherited."""
from __future__ import annotations

import atexit
import multiprocessing
import runpy

import pytest

from ringflow.training.core.launcher import FORKED_RANK


@pytest.mark.job  # a forked process
@pytest.mark.parametrize("code", [0, 7])
def test_a_forked_rank_exits_with_its_code_and_runs_only_its_own_exit_handlers(tmp_path, monkeypatch, code):
    import ringflow.training.__main__ as entry

    said = tmp_path / "said.txt"

    def note(who: str) -> None:
        with open(said, "a") as out:
            out.write(who + "\n")

    def rank_main() -> int:  # stands for the rank: registers a handler of its own (a user's script would)
        atexit.register(note, "the rank's")
        return code

    monkeypatch.setattr(entry, "main", rank_main)
    atexit.register(note, "torchrun's")  # what the process forked from holds
    try:
        child = multiprocessing.get_context("fork").Process(
            target=runpy.run_path, args=(str(FORKED_RANK),), kwargs={"run_name": "__main__"})
        child.start()
        child.join(60)
    finally:
        atexit.unregister(note)
    assert child.exitcode == code
    assert said.read_text().splitlines() == ["the rank's"]
