"""save_health_plot: a readable PNG from health.jsonl records, whatever state the run is in."""
from __future__ import annotations

import math

import pytest

from ringflow.operators.health_plot import _series, save_health_plot

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
