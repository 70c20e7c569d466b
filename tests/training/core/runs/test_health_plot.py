"""save_health_plot: a readable PNG from health.jsonl records, whatever state the run is in."""
from __future__ import annotations

import math

import pytest

from ringflow.training.core.runs.health_plot import _series, draw_health, save_health_plot

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
