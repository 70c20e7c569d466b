"""How the ranks' replays of a non-finite step become the verdict's evidence: data, transient, or undecided."""
import pytest

from ringflow.training.formats.config import RowRef
from ringflow.training.formats.replay_report import ReplayReport, replay_evidence

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
    assert found["replay"]["complete"] is False


def test_a_report_survives_json():
    original = report(1, True, [ROW, RowRef("part-00000.parquet", 3)], error=None)
    assert ReplayReport.from_json(original.to_json()) == original
