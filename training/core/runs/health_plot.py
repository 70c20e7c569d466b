"""A picture of a run's gradient-sync health (health.jsonl), saved as health.png beside the run.

Four panels sharing the step axis: step time per rank, the share of each step spent in all-reduce per
rank (with the run's own `max_sync_share` as a dotted line), the global gradient norm, and the loss.
Restarts (a retried job resuming from a checkpoint) are dashed vertical lines; an elastic job's changes of
workers inside the attempt (its `membership` records, rank/elastic.py) are dash-dot lines at the commit the
workers went back to, labelled "3→2 left" or "2→3 joined", with the steps redone shaded after it; non-finite
values are red marks on the top edge of their panel; the title gives the verdict (`judge`, by the thresholds the run
stored), checksum mismatches and stalls. Pure matplotlib (Agg): no display, no Airflow.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterable, Mapping

from ..remediation import remedy_words

_RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf")
_MAX_RANK_LINES = 10  # beyond this, per-rank panels show min / median / max instead of one line a rank
_CHANGE_COLOR = "#8c564b"
_MAX_CHANGES_NAMED = 4  # the title names this many changes of workers, then counts the rest


@dataclasses.dataclass(frozen=True)
class Change:
    """One change of an elastic job's workers as the plot marks it: at the step the workers went back to
    (`step`), the `redone` steps after it trained again on the new workers."""

    step: int
    redone: int
    label: str        # "3→2 left"
    rank0_changed: bool

    def words(self) -> str:
        extra = [f"{self.redone} redone"] if self.redone else []
        extra += ["new rank 0"] if self.rank0_changed else []
        return f"{self.label} at step {self.step}" + (f" ({', '.join(extra)})" if extra else "")


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def change_of(r: Mapping[str, Any], resumed_at: int = 0) -> Change:
    """The mark of a `membership` record; `resumed_at`: the step the attempt started from, where workers that
    had no commit yet went back to (commit_step None: the run folder's)."""
    step = _int(r.get("commit_step"), resumed_at)
    return Change(step, max(0, _int(r.get("steps_redone"))),
                  f"{r.get('from_world_size', '?')}→{r.get('to_world_size', '?')} {r.get('why', 'changed')}",
                  r.get("rank0_changed") is True)


def _num(value: Any) -> float:
    """records.py writes NaN/Inf as strings; everything not a finite number becomes NaN."""
    if isinstance(value, bool) or value is None:
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _series(records: Iterable[Mapping[str, Any]]):
    steps, step_time, sync_share, grad, loss, bad = [], [], [], [], [], []
    restarts, notes = [], []
    attempt, started_at = 0, 0

    def back_to(at: int) -> None:
        # Steps after the point the job went back to were done again: keep the redone ones.
        keep = [i for i, s in enumerate(steps) if s is not None and s <= at]
        for series in (steps, step_time, sync_share, grad, loss, bad):
            series[:] = [series[i] for i in keep]

    for r in records:
        kind = r.get("type")
        if kind == "start":
            attempt += 1
            started_at = _int(r.get("step"))
            if attempt > 1 or r.get("resumed_from"):
                at = r.get("step") or 0
                restarts.append((at, r.get("resumed_from")))
                back_to(at)
        elif kind == "membership":
            back_to(change_of(r, started_at).step)
        elif kind == "step":
            times = [_num(t) for t in r.get("step_time") or []]
            syncs = [_num(s) for s in r.get("sync_time") or []]
            steps.append(r.get("step"))
            step_time.append([t * 1000 for t in times])
            sync_share.append([s / t if t and t > 0 else math.nan for s, t in zip(syncs, times)])
            grad.append(_num(r.get("grad_norm")))
            loss.append(_num(r.get("loss")))
            bad.append(bool(r.get("nonfinite_ranks")) or not math.isfinite(_num(r.get("grad_norm"))))
        elif kind == "checksum":
            sums = [_num(s) for s in r.get("checksums") or []]
            if sums and any(abs(s - sums[0]) > 1e-5 * max(1.0, abs(sums[0])) or math.isnan(s) for s in sums):
                notes.append(f"replicas differ at step {r.get('step')}")
        elif kind == "stall":
            notes.append(f"stall after step {r.get('last_step')} on rank {r.get('rank')}")
    return steps, step_time, sync_share, grad, loss, bad, restarts, notes


def membership_changes(records: Iterable[Mapping[str, Any]]) -> list[Change]:
    """Every change of workers the records show, oldest first."""
    changes, started_at = [], 0
    for r in records:
        if r.get("type") == "start":
            started_at = _int(r.get("step"))
        elif r.get("type") == "membership":
            changes.append(change_of(r, started_at))
    return changes


def _marker(steps) -> str:
    # Health is measured every few steps (health.every_steps): with few points, show each one.
    return "o" if len(steps) <= 60 else ""


def _per_rank(ax, steps, rows, label: str, precision: int) -> None:
    import numpy as np

    width = max((len(r) for r in rows), default=0)
    table = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        table[i, :len(r)] = r
    if width <= _MAX_RANK_LINES:
        for rank in range(width):
            column = table[:, rank]
            median = float(np.nanmedian(column)) if np.isfinite(column).any() else math.nan
            ax.plot(steps, column, lw=1.0, alpha=0.85, color=_RANK_COLORS[rank % len(_RANK_COLORS)],
                    marker=_marker(steps), ms=3, label=f"rank {rank} (median {median:.{precision}f})")
    else:
        with np.errstate(all="ignore"):
            lo, mid, hi = np.nanmin(table, 1), np.nanmedian(table, 1), np.nanmax(table, 1)
        ax.fill_between(steps, lo, hi, color="#1f77b4", alpha=0.25, label=f"min-max of {width} ranks")
        ax.plot(steps, mid, color="#1f77b4", lw=1.0, marker=_marker(steps), ms=3, label="median")
    ax.set_ylabel(label)
    ax.legend(loc="best", fontsize=8, ncol=2 if width > 4 and width <= _MAX_RANK_LINES else 1, framealpha=0.8)


def _mark(ax, steps, bad, restarts, changes=(), labelled=False) -> None:
    for step, source in restarts:
        ax.axvline(step, color="#555555", ls="--", lw=1)
    for change in changes:
        ax.axvline(change.step, color=_CHANGE_COLOR, ls="-.", lw=1)
        if change.redone:
            ax.axvspan(change.step, change.step + change.redone, color=_CHANGE_COLOR, alpha=0.12, lw=0)
        if labelled:
            ax.text(change.step, 0.98, " " + change.label, transform=ax.get_xaxis_transform(), rotation=90,
                    va="top", ha="right", fontsize=7, color=_CHANGE_COLOR)
    bad_steps = [s for s, b in zip(steps, bad) if b]
    if bad_steps:
        ax.plot(bad_steps, [1.0] * len(bad_steps), "v", color="#d62728", ms=7, clip_on=False,
                transform=ax.get_xaxis_transform(), label="NaN/Inf")


def _health_config(records):
    """The thresholds the run was judged by while it ran (its last `start` record), else the defaults."""
    from ...formats.config import HealthConfig
    from ...health.verdict import thresholds

    return thresholds(records) or HealthConfig()


def save_health_plot(records: list[dict], out_path: str, title: str | None = None,
                     remedies: Iterable[Mapping[str, Any]] = ()) -> str:
    """Draw `records` (health.jsonl parsed) into a PNG at `out_path`; returns `out_path`. remedies: what
    the retries changed (RunResult.remedies), named in the title."""
    import matplotlib.pyplot as plt

    fig = draw_health(records, title, remedies)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def draw_health(records: list[dict], title: str | None = None, remedies: Iterable[Mapping[str, Any]] = ()):
    """The figure of `records` (a matplotlib Figure; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from ...health.verdict import judge

    records = list(records)
    health = _health_config(records)
    steps, step_time, sync_share, grad, loss, bad, restarts, notes = _series(records)
    changes = membership_changes(records)
    fig, axes = plt.subplots(2, 2, figsize=(13, 7.5), sharex=True, constrained_layout=True)
    (ax_time, ax_sync), (ax_grad, ax_loss) = axes
    if steps:
        _per_rank(ax_time, steps, step_time, "step time (ms)", precision=1)
        ax_time.set_ylim(bottom=0)
        # The run's own limit (its start record), as the verdict used: above it the verdict says DEGRADED.
        ax_sync.axhline(health.max_sync_share, color="#999999", lw=0.8, ls=":",
                        label=f"sync-bound limit ({health.max_sync_share:g})")
        _per_rank(ax_sync, steps, sync_share, "all-reduce share of the step", precision=2)
        ax_sync.set_ylim(0, 1.05)
        ax_grad.plot(steps, grad, color="#2ca02c", lw=1.0, marker=_marker(steps), ms=3)
        finite_grads = [g for g in grad if math.isfinite(g) and g > 0]
        if finite_grads and max(finite_grads) / min(finite_grads) > 50:
            ax_grad.set_yscale("log")
        ax_grad.set_ylabel("global gradient norm")
        ax_loss.plot(steps, loss, color="#9467bd", lw=1.0, marker=_marker(steps), ms=3)
        ax_loss.set_ylabel("training loss (mean over ranks)")
    else:
        for ax in axes.flat:
            ax.text(0.5, 0.5, "no step records yet", ha="center", va="center", transform=ax.transAxes,
                    color="#777777")
    for ax, name in zip(axes.flat, ("Step time per rank", "Sync share per rank", "Gradient norm", "Loss")):
        ax.set_title(name, fontsize=11, loc="left")
        ax.grid(True, alpha=0.3)
        if steps:
            _mark(ax, steps, bad, restarts, changes, labelled=ax is axes[0][0])
    from matplotlib.ticker import MaxNLocator

    for ax in axes[1]:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if changes:
        named = ", ".join(c.words() for c in changes[:_MAX_CHANGES_NAMED])
        more = f" and {len(changes) - _MAX_CHANGES_NAMED} more" if len(changes) > _MAX_CHANGES_NAMED else ""
        notes.insert(0, f"workers changed: {named}{more} (dash-dot)")
    if restarts:
        sources = ", ".join(str(src or f"step {s}") for s, src in restarts)
        notes.insert(0, f"resumed from {sources} (dashed)")
    if any(bad):
        first = next(s for s, b in zip(steps, bad) if b)
        notes.insert(0, f"NaN/Inf from step {first}")
    remedies = list(remedies)
    if remedies:
        notes.append("remediated: " + "; ".join(remedy_words(r) for r in remedies))
    heading = title or "Gradient-sync health"
    if steps:
        heading += f": {len(steps)} measured steps, {max(len(r) for r in step_time)} ranks"
        verdict = judge(records, health)
        heading += f"\nverdict {verdict.status}: {verdict.reason}"
    if notes:
        heading += "\n" + "; ".join(notes)
    fig.suptitle(heading, fontsize=12)
    return fig
