"""save_health_plot: a readable PNG from health.jsonl records, whatever state the run is in."""
from __future__ import annotations

import math

import pytest

from ringflow.training.core.runs.health_plot import (Change, _series, change_of, draw_health, membership_changes,
                                                     save_health_plot)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def step(s: int, ranks: int = 2, nan: bool = False) -> dict:
    times = [0.010 + 0.001 * r for r in range(ranks)]
    return {"type": "step", "step": s, "epoch": 0, "step_time": times, "sync_time": [t / 4 for t in times],
            "compute_time": [3 * t / 4 for t in times], "loss": "nan" if nan else 2.0 / s,
            "grad_norm": "nan" if nan else 1.0 / s, "nonfinite_ranks": [1] if nan else [], "samples_per_sec": 100.0,
            "time": float(s)}


def image_size(path) -> tuple[int, int]:
    data = open(path, "rb").read(32)
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_four_panels_from_a_healthy_run(tmp_path):
    records = [{"type": "start", "step": 0, "resumed_from": None, "world_size": 2}]
    records += [step(s) for s in range(1, 45)]
    records += [{"type": "checksum", "step": 10, "checksums": [1.0, 1.0]}, {"type": "end", "status": "succeeded"}]
    out = save_health_plot(records, str(tmp_path / "sub" / "health.png"))
    assert out == str(tmp_path / "sub" / "health.png")
    assert image_size(out) == (1300, 750)


def test_resumed_run_keeps_the_redone_steps_once():
    records = [{"type": "start", "step": 0}] + [step(s) for s in range(1, 26)]
    records += [{"type": "start", "step": 20, "resumed_from": "ckpt-000000020"}] + [step(s) for s in range(21, 45)]
    steps, step_time, sync_share, grad, loss, bad, restarts, notes = _series(records)
    assert steps == list(range(1, 45))
    assert restarts == [(20, "ckpt-000000020")]
    assert sync_share[0] == pytest.approx([0.25, 0.25])
    assert step_time[0] == pytest.approx([10.0, 11.0])


def test_nonfinite_steps_and_stalls_are_marked(tmp_path):
    records = [step(s) for s in range(1, 5)] + [step(5, nan=True)]
    records += [{"type": "stall", "rank": 1, "last_step": 5, "seconds": 130.0},
                {"type": "checksum", "step": 5, "checksums": [1.0, 1.5]}]
    steps, _, _, grad, loss, bad, _, notes = _series(records)
    assert bad == [False] * 4 + [True] and math.isnan(grad[-1]) and math.isnan(loss[-1])
    assert notes == ["stall after step 5 on rank 1", "replicas differ at step 5"]
    image_size(save_health_plot(records, str(tmp_path / "h.png"), title="nan run"))


@pytest.mark.parametrize("records", [[], [{"type": "start", "step": 0}], [step(1, ranks=1)],
                                     [step(s, ranks=16) for s in range(1, 30)]])
def test_edge_cases_still_draw(tmp_path, records):
    image_size(save_health_plot(records, str(tmp_path / "h.png")))


def drawn(records, title=None):
    """What the figure shows: its title and, by panel title, each panel's lines (label, y values)."""
    import matplotlib.pyplot as plt

    fig = draw_health(records, title)
    try:
        panels = {ax.get_title(loc="left"): [(line.get_label(), list(line.get_ydata())) for line in ax.get_lines()]
                  for ax in fig.axes}
        return fig.get_suptitle(), panels
    finally:
        plt.close(fig)


def start(**health) -> dict:
    return {"type": "start", "step": 0, "resumed_from": None, "world_size": 2, "health": health}


@pytest.mark.parametrize("records, verdict", [
    ([start()] + [step(s) for s in range(1, 30)], "verdict HEALTHY: no sign of trouble"),
    ([start()] + [step(s) for s in range(1, 5)] + [step(5, nan=True)], "verdict NONFINITE"),
    ([start()] + [step(s) for s in range(1, 5)] + [{"type": "checksum", "step": 4, "checksums": [1.0, 1.5]}],
     "verdict DIVERGED"),
    # a run judged by its own, stricter limit: a quarter of each step in all-reduce is too much here
    ([start(max_sync_share=0.2)] + [step(s) for s in range(1, 30)], "verdict DEGRADED"),
])
def test_the_title_gives_the_verdict(records, verdict):
    heading, _ = drawn(records, title="run r1")
    assert heading.startswith("run r1: ") and verdict in heading


@pytest.mark.parametrize("health, limit", [({}, 0.85), ({"max_sync_share": 0.6}, 0.6), ({"max_sync_share": 0.3}, 0.3)])
def test_the_sync_panel_draws_the_runs_own_limit(health, limit):
    _, panels = drawn([start(**health)] + [step(s) for s in range(1, 30)])
    limits = [(label, ys) for label, ys in panels["Sync share per rank"] if label.startswith("sync-bound limit")]
    assert limits == [(f"sync-bound limit ({limit:g})", [limit, limit])]
    ranks = [ys for label, ys in panels["Sync share per rank"] if label.startswith("rank ")]
    assert len(ranks) == 2 and ranks[0][0] == pytest.approx(0.25)  # each step's share, as measured


def test_restarts_and_nonfinite_steps_are_drawn():
    records = [start()] + [step(s) for s in range(1, 26)]
    records += [{"type": "start", "step": 20, "resumed_from": "ckpt-000000020"}] + [step(s) for s in range(21, 30)]
    records += [step(30, nan=True)]
    heading, panels = drawn(records)
    assert "resumed from ckpt-000000020 (dashed)" in heading and "NaN/Inf from step 30" in heading
    for name in ("Step time per rank", "Sync share per rank", "Gradient norm", "Loss"):
        labels = [label for label, _ in panels[name]]
        assert "NaN/Inf" in labels, name
        restart_lines = [ys for label, ys in panels[name] if label.startswith("_") and ys == [0, 1]]
        assert restart_lines, name  # axvline: y from 0 to 1 in axes units


def test_the_title_names_what_the_retries_changed():
    remedies = [{"try": 2, "verdict": "NONFINITE", "remedy": "lower_learning_rate", "words": "NaN"},
                {"try": 3, "verdict": "OOM", "remedy": "smaller_batch", "words": "out of memory"}]
    import matplotlib.pyplot as plt

    fig = draw_health([step(s) for s in range(1, 4)], remedies=remedies)
    try:
        title = fig.get_suptitle()
    finally:
        plt.close(fig)
    assert "remediated: try 2: lower_learning_rate after NONFINITE; try 3: smaller_batch after OOM" in title
    assert "remediated" not in drawn([step(s) for s in range(1, 4)])[0]


def membership(why, sizes, commit_step, redone, rank0_changed=False, at=0.0):
    """A `membership` record as rank/elastic.py writes it (Membership.as_record)."""
    return {"type": "membership", "why": why, "detail": "Horovod has been shut down", "from_world_size": sizes[0],
            "to_world_size": sizes[1], "commit_step": commit_step, "steps_redone": redone, "failed_at": at,
            "resumed_at": at + 0.6, "rank0_changed": rank0_changed, "recovery_seconds": 0.6, "seq": 1, "time": at}


def elastic_run():
    """Three workers, rank 0 killed at step 13 (back to the commit of step 10, 2 redone), a worker joining at
    the commit of step 30: the step records of both rounds, as rank 0 wrote them."""
    records = [start()] + [step(s, ranks=3) for s in range(1, 13)]
    records += [membership("left", (3, 2), 10, 2, rank0_changed=True)] + [step(s, ranks=2) for s in range(11, 31)]
    records += [membership("joined", (2, 3), 30, 0)] + [step(s, ranks=3) for s in range(31, 41)]
    return records


def test_changes_of_workers_are_marked_at_the_commit_gone_back_to():
    records = elastic_run()
    steps, step_time, *_ = _series(records)
    assert steps == list(range(1, 41))  # the redone steps 11 and 12 once, as the 2 survivors trained them
    assert [len(t) for t in step_time] == [3] * 10 + [2] * 20 + [3] * 10
    assert membership_changes(records) == [Change(10, 2, "3→2 left", True), Change(30, 0, "2→3 joined", False)]
    heading, panels = drawn(records)
    assert ("workers changed: 3→2 left at step 10 (2 redone, new rank 0), 2→3 joined at step 30 (dash-dot)"
            in heading), heading


def test_each_panel_draws_the_changes_and_the_top_left_names_them():
    import matplotlib.pyplot as plt

    fig = draw_health(elastic_run())
    try:
        for ax in fig.axes:
            lines = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "-."]
            assert lines == [10, 30], ax.get_title(loc="left")
            assert len(ax.patches) == 1  # the redone steps after step 10 shaded; the join redid none
        texts = {ax.get_title(loc="left"): [t.get_text().strip() for t in ax.texts] for ax in fig.axes}
        assert texts["Step time per rank"] == ["3→2 left", "2→3 joined"] and texts["Loss"] == []
    finally:
        plt.close(fig)


@pytest.mark.parametrize("record, resumed_at, expected", [
    (membership("left", (4, 3), 50, 3), 0, Change(50, 3, "4→3 left", False)),
    # no commit yet: the workers went back to where the attempt started (the run folder's checkpoint)
    (membership("left", (2, 1), None, 7), 20, Change(20, 7, "2→1 left", False)),
    # a record missing its fields still marks something readable
    ({"type": "membership"}, 0, Change(0, 0, "?→? changed", False)),
])
def test_the_mark_of_one_membership_record(record, resumed_at, expected):
    assert change_of(record, resumed_at) == expected


def test_many_changes_are_counted_in_the_title():
    records = [start()] + [step(s) for s in range(1, 5)]
    for n in range(6):
        records += [membership("left" if n % 2 == 0 else "joined", (2, 2), 4 + n, 0), step(5 + n)]
    heading, _ = drawn(records)
    assert heading.count("→") == 4 and "and 2 more (dash-dot)" in heading
