"""The one-screen health summary the train task's log ends with: what a person reading the log needs before
opening the run folder. Pure: from the attempt's RunResult, the verdict that decided the task and the run's
health records to at most MAX_LINES lines. No torch, no Airflow.

Step figures (samples/s, sync share, gradient norm) are this attempt's records only, read as the MLflow
metrics read them (tracking/measurements.py), so the log and MLflow agree; resume points are the run's.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Mapping

from ...formats.run_result import RunResult
from ...health.verdict import OOM, Verdict, slowest_rank
from ..remediation import remedy_words
from ..tracking.measurements import from_step_record

MAX_LINES = 20
# A verdict's reason can run to a paragraph (an OOM's lists every advice): the summary keeps its start.
MAX_REASON_CHARS = 240
MAX_ADVICE_LINES = 3
# An elastic job's changes of workers are named one by one up to this many, then counted.
MAX_CHANGES_NAMED = 4


def _clip(text: str, limit: int = MAX_REASON_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _own(records: Iterable[Mapping[str, Any]], attempt: str | None) -> list[Mapping[str, Any]]:
    """The records of `attempt` (the one that started last when None or when no record names it)."""
    records = list(records)
    if attempt is None or not any(r.get("attempt") == attempt for r in records):
        starts = [r.get("attempt") for r in records if r.get("type") == "start"]
        attempt = starts[-1] if starts else None
    return [r for r in records if attempt is None or r.get("attempt") in (None, attempt)]


def _range(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "none finite"
    bad = len(values) - len(finite)
    return f"{min(finite):.3g} .. {max(finite):.3g}" + (f" ({bad} non-finite)" if bad else "")


def _steps_lines(steps: list[Mapping[str, Any]]) -> list[str]:
    if not steps:
        return ["steps measured: none"]
    metrics: dict[str, list[tuple[int, float]]] = {}
    for r in steps:
        for m in from_step_record(r):
            metrics.setdefault(m.key, []).append((m.step, m.value))
    lines = [f"steps measured: {len(steps)} (steps {steps[0].get('step')}..{steps[-1].get('step')})"]
    shares = [(s, v) for s, v in metrics.get("health/sync_share", []) if math.isfinite(v)]
    if shares:
        step, share = max(shares, key=lambda sv: sv[1])
        lines.append(f"sync share: max {share:.0%} (step {step}), median "
                     f"{sorted(v for _, v in shares)[len(shares) // 2]:.0%}")
    lines.append("gradient norm: " + _range([v for _, v in metrics.get("health/grad_norm", [])]))
    slow = Counter()
    ratios: list[float] = []
    for r in steps:
        compute = [c for c in r.get("compute_time") or [] if isinstance(c, (int, float))]
        if len(compute) >= 2:
            rank, ratio, _ = slowest_rank(compute)
            slow[rank] += 1
            ratios.append(ratio)
    if slow:
        rank, count = slow.most_common(1)[0]
        lines.append(f"slowest rank: {rank} in {count} of {len(ratios)} steps; the slowest computed up to "
                     f"{max(ratios):.2f}x the others' median (median {sorted(ratios)[len(ratios) // 2]:.2f}x)")
    return lines


def _checkpoint_line(records: list[Mapping[str, Any]], result: RunResult | None) -> str:
    taken = [r for r in records if r.get("type") == "checkpoint"]
    final = result.checkpoint if result is not None else None
    last = final or (taken[-1].get("name") if taken else None)
    line = f"checkpoints: {len(taken)} taken this attempt"
    if last:
        line += f", {'final' if final else 'last'} {last}"
    if result is not None and result.checkpoint_blocked_seconds is not None:
        line += f"; training blocked {result.checkpoint_blocked_seconds:.1f}s in them"
    return line


def _resume_line(all_records: list[Mapping[str, Any]], result: RunResult | None) -> str | None:
    points = [f"{r.get('resumed_from')} (step {r.get('step')})" for r in all_records
              if r.get("type") == "start" and r.get("resumed_from")]
    if result is not None and result.resumed_from and not points:
        points = [str(result.resumed_from)]
    if not points:
        return None
    skipped = len(result.skipped_checkpoints) if result is not None else 0
    more = f"; {skipped} newer checkpoint(s) skipped as unusable" if skipped else ""
    return f"resumed from: {', '.join(points[-4:])}" + (f" (+{len(points) - 4} earlier)" if len(points) > 4 else "") + more


def _change_words(c: Mapping[str, Any]) -> str:
    went = f"step {c['commit_step']}" if c.get("commit_step") is not None else "the run folder"
    cost = [f"back to {went}", f"{c.get('steps_redone', '?')} redone"]
    cost += ["new rank 0"] if c.get("rank0_changed") is True else []
    recovery = c.get("recovery_seconds")
    cost += [f"{recovery:.2f}s"] if isinstance(recovery, (int, float)) and not isinstance(recovery, bool) else []
    sizes = f"{c.get('from_world_size', '?')}→{c.get('to_world_size', '?')}"
    return f"{sizes} {c.get('why', 'changed')} ({', '.join(cost)})"


def _membership_line(own: list[Mapping[str, Any]], result: RunResult | None) -> str | None:
    """This attempt's changes of workers (an elastic job, rank/elastic.py): its result's, else its records'."""
    changes = list(result.membership_changes) if result is not None and result.membership_changes else [
        r for r in own if r.get("type") == "membership"]
    if not changes:
        return None
    named = "; ".join(_change_words(c) for c in changes[:MAX_CHANGES_NAMED])
    more = f"; +{len(changes) - MAX_CHANGES_NAMED} more" if len(changes) > MAX_CHANGES_NAMED else ""
    return _clip(f"workers changed {len(changes)}x: {named}{more}", 2 * MAX_REASON_CHARS)


def _oom_lines(verdict: Verdict | None) -> list[str]:
    if verdict is None or verdict.status != OOM:
        return []
    advice = [a.get("words", "") for a in verdict.evidence.get("advice") or [] if isinstance(a, Mapping)]
    return [f"OOM advice {i}: {_clip(words, 160)}" for i, words in enumerate(advice[:MAX_ADVICE_LINES], 1)]


def _remedy_lines(remedies: Iterable[Mapping[str, Any]]) -> list[str]:
    return [f"remediated: {remedy_words(r)}: {_clip(str(r.get('words', '')), 160)}" for r in remedies]


def health_summary(result: RunResult | None, verdict: Verdict | None,
                   records: Iterable[Mapping[str, Any]] | None,
                   remedies: Iterable[Mapping[str, Any]] | None = None) -> list[str]:
    """At most MAX_LINES lines: verdict and reason, steps and epochs, samples/s, max sync share, gradient
    norm range, the slowest rank, checkpoints and the final one, resume points, an elastic job's changes of
    workers (result.json's membership_changes, else the attempt's records), OOM advice, and what the
    retries changed (`remedies`: the try's applied remedies; None: the result's)."""
    verdict = verdict or (result.verdict if result is not None else None)
    all_records = list(records or [])
    own = _own(all_records, result.attempt if result is not None else None)
    lines = ["── health summary ──"]
    lines.append(f"verdict: {verdict.status}: {_clip(verdict.reason)}" if verdict else "verdict: none recorded")
    if result is not None:
        lines.append(f"result: {result.status} at step {result.step}, epoch {result.epoch}, on {result.world_size} "
                     f"worker(s), loss {result.loss:.4g}")
        if result.samples_per_sec_after_warmup is not None:
            monitor = result.health_monitor_share_after_warmup
            share = f"; health monitor {monitor:.1%} of step time" if monitor is not None else ""
            lines.append(f"throughput: {result.samples_per_sec_after_warmup:.0f} samples/s after warm-up{share}")
    else:
        lines.append("result: none written by this attempt")
    if records is None:
        lines.append("health records: could not be read")
    else:
        lines += _steps_lines([r for r in own if r.get("type") == "step"])
        lines.append(_checkpoint_line(own, result))
        resumed = _resume_line(all_records, result)
        lines += [resumed] if resumed else []
    changed = _membership_line(own if records is not None else [], result)
    lines += [changed] if changed else []
    lines += _oom_lines(verdict)
    lines += _remedy_lines(remedies if remedies is not None else result.remedies if result is not None else ())
    return lines[:MAX_LINES]
