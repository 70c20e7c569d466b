"""The peer copy of an elastic DDP job (rank/peer_copy.py, rank/ddp_elastic.py): where it goes, which copy is the
newest, what a restart resumes from, and a copy written and read back whole."""
import os

import pytest
import torch

from ringflow.training.rank.peer_copy import (PREFIX, BeatFile, Choice, Source, base_folder, choose, copy_folder,
                                              copy_name, folder_name, newest_copy, remove, same_host_only)


@pytest.mark.parametrize("copy_steps, store_step, done, expected", [
    ([-1, -1], None, None, Choice(Source.STORE, None, None)),          # nothing anywhere: the start
    ([-1, -1], 20, None, Choice(Source.STORE, None, None)),            # no copy: the store's
    ([10, -1, -1], None, None, Choice(Source.PEER_COPY, 0, 10)),       # a copy, no checkpoint
    ([10, -1], 10, None, Choice(Source.PEER_COPY, 0, 10)),             # equal steps: the local copy
    ([10, -1], 20, None, Choice(Source.STORE, None, None)),            # the store's is newer
    ([-1, 15, 30, 30], 20, None, Choice(Source.PEER_COPY, 2, 30)),     # the lowest rank of the newest host
    ([30, 15], None, [True, False], Choice(Source.PEER_COPY, 1, 15)),  # a finished run's copy is never chosen
    ([30], 45, [True], Choice(Source.STORE, None, None)),
])
def test_a_restart_resumes_from_the_newest_state_there_is(copy_steps, store_step, done, expected):
    assert choose(copy_steps, store_step, done) == expected


@pytest.mark.parametrize("names, expected", [
    ([], None),
    (["beat"], None),
    (["step-000000000010", "beat"], (10, "step-000000000010")),
    (["step-000000000010", "step-000000000005", ".step-000000000015.77.tmp"], (10, "step-000000000010")),
    (["step-10", "step-000000000010.pt"], None),  # not a copy's name
])
def test_the_newest_whole_copy_is_found_by_its_name(names, expected):
    assert newest_copy(names) == expected


def test_a_copy_name_sorts_by_step():
    assert copy_name(7) == "step-000000000007" and newest_copy([copy_name(9), copy_name(10)])[0] == 10


@pytest.mark.parametrize("run_uri, attempt, same_as", [
    ("s3://bucket/runs/a", "3e7840afa900425eabf7d11b177981e0", None),
    ("s3://bucket/runs/a", "train-job-17", None),
])
def test_a_folder_is_named_by_run_and_attempt(run_uri, attempt, same_as):
    name = folder_name(run_uri, attempt)
    assert name.startswith(PREFIX) and name.endswith(f"-{attempt}") and "/" not in name
    assert folder_name(run_uri, attempt) == name  # the launcher and every rank name it alike
    assert folder_name(run_uri + "x", attempt) != name and folder_name(run_uri, attempt + "x") != name


@pytest.mark.parametrize("attempt", ["../../etc", "a b/c", ".", "x" * 200])
def test_an_attempt_id_that_is_no_plain_name_is_digested(attempt):
    name = folder_name("file:///runs/a", attempt)
    assert "/" not in name and " " not in name and not name.endswith("-.") and len(name) < 80


def test_copies_go_to_the_memory_disk_where_there_is_one(tmp_path):
    assert base_folder(str(tmp_path)) == str(tmp_path)
    assert base_folder(str(tmp_path / "absent")) == __import__("tempfile").gettempdir()
    assert copy_folder("file:///r", "a", base=str(tmp_path)) == str(tmp_path / folder_name("file:///r", "a"))


@pytest.mark.parametrize("hosts, holder, expected", [
    (["vm", "vm", "vm"], 0, True), (["a", "a", "b"], 0, False), (["a"], 0, True),
])
def test_ranks_on_the_holders_host_only_read_the_copy_themselves(hosts, holder, expected):
    assert same_host_only(hosts, holder) is expected


def test_the_beat_says_the_last_step_and_when(tmp_path):
    beat = BeatFile(str(tmp_path))
    assert beat.read() is None
    beat.write(12, 3)
    beat.write(13, 3)
    seen = BeatFile(str(tmp_path)).read()  # as the restarted process reads it
    assert (seen.step, seen.world_size) == (13, 3) and seen.at > 0
    beat.close()


def test_a_copy_is_written_whole_keeps_only_the_newest_and_reads_back(tmp_path):
    from ringflow.training.rank.ddp_elastic import read_copy, write_copy
    from ringflow.training.rank.commits import Commit
    from ringflow.training.rank.training_state import TrainingState

    def commit(step):
        state = TrainingState(model={"w": torch.full((3,), float(step))}, optimizer={"state": {}, "param_groups": []},
                              cursor=(0, 2), step=step, torch_rng=torch.get_rng_state(), remaining=((5, 9),))
        return Commit(state, {"step": step, "world_size": 3})

    write_copy(str(tmp_path), commit(5))
    write_copy(str(tmp_path), commit(10))
    assert sorted(os.listdir(tmp_path)) == [copy_name(10)]
    back = read_copy(str(tmp_path), copy_name(10))
    assert back.step == 10 and back.meta == {"step": 10, "world_size": 3} and back.state.remaining == ((5, 9),)
    assert torch.equal(back.state.model["w"], torch.full((3,), 10.0))
    assert remove(str(tmp_path)) and not remove(str(tmp_path))


def test_a_copy_that_fails_to_be_written_removes_the_kept_ranges_and_is_written_again(tmp_path, monkeypatch):
    """The host's copy comes first (rank/host_ranges.py): the ranks' kept ranges give way to it."""
    from ringflow.training.rank import ddp_elastic
    from ringflow.training.rank.commits import Commit
    from ringflow.training.rank.host_ranges import GIVEN_WAY, rank_folder
    from ringflow.training.rank.training_state import TrainingState

    os.makedirs(rank_folder(str(tmp_path), 1))
    write, failed = ddp_elastic.write_copy, []

    def full_once(folder, commit):
        if not failed:
            failed.append(os.listdir(rank_folder(folder, 1)))
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
        return write(folder, commit)

    monkeypatch.setattr(ddp_elastic, "write_copy", full_once)
    state = TrainingState(model={"w": torch.ones(3)}, optimizer={"state": {}, "param_groups": []}, cursor=(0, 0),
                          step=5, torch_rng=torch.get_rng_state())
    writer = ddp_elastic.CopyWriter(str(tmp_path))
    writer.submit(Commit(state, {"step": 5}))
    assert writer.wait(30) and writer.written_step == 5 and writer.failure is None
    assert failed == [[]] and os.listdir(tmp_path / "ranges") == [GIVEN_WAY] and copy_name(5) in os.listdir(tmp_path)


def test_a_deliberate_end_is_noted_for_the_restart_to_end_with(tmp_path):
    from ringflow.training.rank.peer_copy import read_end, write_end

    folder = str(tmp_path / "copies")
    assert read_end(folder) is None  # none noted: the restart resumes
    write_end(folder, 7)
    assert read_end(folder) == 7
