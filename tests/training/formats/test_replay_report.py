"""How the ranks' replays of a non-finite step become the verdict's evidence: data, transient, or undecided."""
import pytest

from ringflow.training.formats.config import RowRef
from ringflow.training.formats.replay_report import ReplayReport, replay_evidence, step_to_replay

ROW = RowRef("part-00001.parquet", 17)


def report(rank, nonfinite, rows=(), step=12, error=None, complete=True):
    return ReplayReport(rank, step, 10, nonfinite, tuple(rows), tests=3, complete=complete, seconds=0.5, error=error)


# (reports, world size) -> (replay or unavailable, reproducible, rows)
ROWS = {
    "a rank's rows are bad alone: the data": ([report(0, False), report(1, True, [ROW])], 2, True, [ROW]),
    "the minibatch only as a whole: the data, no row": ([report(0, True), report(1, False)], 2, True, []),
    "finite on every rank: transient": ([report(0, False), report(1, False)], 2, False, []),
    "a rank silent, another bad: still the data": ([report(1, True, [ROW])], 2, True, [ROW]),
    "a rank silent, the rest finite: undecided": ([report(0, False)], 2, None, None),
    "a rank's replay failed, the rest finite: undecided": ([report(0, False), report(1, None, error="replay failed: x")],
                                                           2, None, None),
    "a report of another step does not count": ([report(0, False), report(1, True, [ROW], step=11)], 2, None, None),
}


@pytest.mark.parametrize("name", ROWS)
def test_the_evidence(name):
    reports, world_size, reproducible, rows = ROWS[name]
    found = replay_evidence(12, world_size, reports, waited_seconds=70)
    if reproducible is None:
        assert set(found) == {"replay_unavailable"} and "decided nothing" in found["replay_unavailable"]
        return
    replay = found["replay"]
    assert replay["reproducible"] is reproducible and replay["step"] == 12 and replay["checkpoint_step"] == 10
    assert replay["rows"] == [{"file": r.file, "row": r.row} for r in rows]
    assert replay["reason"].startswith("data:" if reproducible else "transient:")


def test_the_reason_names_the_rows_and_silent_ranks_are_listed():
    found = replay_evidence(12, 3, [report(1, True, [ROW]), report(2, False)], waited_seconds=70)
    assert "part-00001.parquet#17" in found["replay"]["reason"] and found["replay"]["ranks_unanswered"] == [0]
    assert "rank(s) [0] sent no report within 70s" in replay_evidence(12, 2, [report(1, False)], 70)["replay_unavailable"]


def test_an_incomplete_row_search_is_said():
    found = replay_evidence(12, 1, [report(0, True, [ROW], complete=False)], 70)
    assert found["replay"]["complete"] is False and found["replay"]["seconds"] == 70


def test_a_report_survives_json():
    original = report(1, True, [ROW, RowRef("part-00000.parquet", 3)], error=None)
    assert ReplayReport.from_json(original.to_json()) == original


# (evidence, first step of the attempt, replay_seconds) -> the step, or the start of why not
STEPS = {
    "a step's loss or gradient": ({"step": 12, "detected_at_step": 20}, 0, 60, 12),
    "replay off": ({"step": 12, "detected_at_step": 12}, 0, 0, "replay is off"),
    "found in a checksum": ({"step": 50, "ranks": [1]}, 0, 60, "replay: the step where the NaN/Inf began is not known"),
    "found in a checkpoint's state": ({"step": 50, "tensors": ["model.w"], "seen_by": "the checkpoint writer"}, 0, 60,
                                      "replay: the step where the NaN/Inf began is not known"),
    "a step before this attempt": ({"step": 10, "detected_at_step": 12}, 10, 60, "replay: step 10 is not one"),
}


@pytest.mark.parametrize("name", STEPS)
def test_the_step_to_replay(name):
    evidence, first_step, seconds, expected = STEPS[name]
    got = step_to_replay(evidence, first_step, seconds)
    assert got == expected if isinstance(expected, int) else got.startswith(expected)
