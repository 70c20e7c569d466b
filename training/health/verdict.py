"""From a window of health records to one verdict with its evidence. Pure: no clocks, no I/O.

Record types (health.jsonl, one JSON object a line; see records.py):
  step      per measured step: per-rank step/compute/sync seconds, loss, global gradient norm, non-finite flags
  checksum  every m steps: every rank's parameter checksum
  stall     a rank's watchdog saw no step complete for stall_seconds
  start/end bookkeeping

Verdicts, worst first: NONFINITE, DIVERGED, STALLED, DEGRADED, HEALTHY. The first three are fatal;
DEGRADED is fatal only when the job says so (health.stop_on_degraded).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from typing import Any, Iterable, Mapping

from ringflow.training.config import HealthConfig

HEALTHY, DEGRADED, STALLED, DIVERGED, NONFINITE = "HEALTHY", "DEGRADED", "STALLED", "DIVERGED", "NONFINITE"
FATAL = (NONFINITE, DIVERGED, STALLED)
# Fewer measured steps than this and a straggler or sync-share reading is noise, not evidence.
MIN_STEPS_FOR_DEGRADED = 5


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: str
    reason: str = ""
    evidence: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def is_fatal(self, stop_on_degraded: bool = False) -> bool:
        return self.status in FATAL or (stop_on_degraded and self.status == DEGRADED)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "evidence": dict(self.evidence)}


def judge(records: Iterable[Mapping[str, Any]], cfg: HealthConfig, now: float | None = None) -> Verdict:
    """The verdict on a run's health records. `now` (unix seconds) lets a watcher outside the job call a
    run STALLED when records stop arriving; inside the job the watchdog writes a `stall` record instead."""
    records = list(records)
    # A resumed run appends to the same health.jsonl: judge only the attempt that started last.
    starts = [i for i, r in enumerate(records) if r.get("type") == "start"]
    if starts:
        records = records[starts[-1]:]
    steps = [r for r in records if r.get("type") == "step"]
    for check in (_nonfinite, _diverged):
        verdict = check(records, cfg)
        if verdict:
            return verdict
    verdict = _stalled(records, cfg, now)
    if verdict:
        return verdict
    window = steps[-cfg.window_steps:]
    if len(window) >= min(MIN_STEPS_FOR_DEGRADED, cfg.window_steps):
        for check in (_straggler, _sync_bound):
            verdict = check(window, cfg)
            if verdict:
                return verdict
    last = steps[-1]["step"] if steps else None
    return Verdict(HEALTHY, "no sign of trouble", {"last_step": last, "steps_measured": len(steps)})


def _nonfinite(records, cfg) -> Verdict | None:
    for r in records:
        if r.get("type") == "checksum" and not all(_finite(s) for s in r["checksums"]):
            # A NaN/Inf gradient applied between two measurements (health.nonfinite_every_step off).
            ranks = [rank for rank, s in enumerate(r["checksums"]) if not _finite(s)]
            return Verdict(NONFINITE,
                           f"NaN/Inf in the parameters of rank(s) {ranks} at step {r['step']}: lower the learning "
                           "rate, check the input data for NaN/Inf, or clip gradients; resume from the last "
                           "checkpoint (it was written before)", {"step": r["step"], "ranks": ranks})
        if r.get("type") == "step" and (r.get("nonfinite_ranks") or not _finite(r.get("grad_norm"))):
            ranks, step = r.get("nonfinite_ranks") or [], r["step"]
            # Where it began: the earliest step at which a rank's own loss went NaN/Inf (between measurements
            # the others catch it a step later, from the shared parameters).
            firsts = {rank: s for rank, s in enumerate(r.get("first_nonfinite_step") or []) if s is not None}
            if firsts:
                step = min(firsts.values())
                ranks = sorted(rank for rank, s in firsts.items() if s == step)
            where = f"rank(s) {ranks}" if ranks else "the averaged gradient"
            return Verdict(NONFINITE,
                           f"NaN/Inf in {where} at step {step}: lower the learning rate, check the input "
                           "data for NaN/Inf, or clip gradients",
                           {"step": step, "ranks": ranks, "grad_norm": r.get("grad_norm"), "loss": r.get("loss"),
                            "detected_at_step": r["step"]})
    return None


def _diverged(records, cfg) -> Verdict | None:
    for r in records:
        if r.get("type") != "checksum":
            continue
        sums = r["checksums"]
        diffs = [abs(s - sums[0]) / max(1.0, abs(sums[0])) for s in sums]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        if diffs[worst] > cfg.divergence_tolerance:
            return Verdict(DIVERGED,
                           f"replica on rank {worst} differs from rank 0 at step {r['step']} (relative "
                           f"difference {diffs[worst]:.3g} > {cfg.divergence_tolerance:g}): parameters were "
                           "changed outside the synchronized optimizer step; restart from the last checkpoint",
                           {"step": r["step"], "rank": worst, "checksums": sums, "relative_difference": diffs[worst]})
    return None


def _stalled(records, cfg, now) -> Verdict | None:
    for r in records:
        if r.get("type") == "stall":
            return Verdict(STALLED,
                           f"no step completed for {r['seconds']:.0f}s after step {r.get('last_step')} "
                           f"(seen by rank {r.get('rank')}): a rank hangs or the network is partitioned; "
                           "check that rank's log and the hosts' connectivity",
                           {"rank": r.get("rank"), "last_step": r.get("last_step"), "seconds": r["seconds"]})
    if now is not None and records and not any(r.get("type") == "end" for r in records):
        last = records[-1]
        silent = now - last["time"]
        if silent > cfg.stall_seconds:
            return Verdict(STALLED,
                           f"the job wrote no health record for {silent:.0f}s (limit {cfg.stall_seconds:g}s): "
                           "it is hung or dead; check the workers' logs",
                           {"last_step": last.get("step"), "seconds": silent})
    return None


def _straggler(window, cfg) -> Verdict | None:
    ratios, lags, slowest = [], [], Counter()
    for r in window:
        compute = r["compute_time"]
        if len(compute) < 2:
            return None
        worst = max(range(len(compute)), key=compute.__getitem__)
        rest = statistics.median(compute[:worst] + compute[worst + 1:])
        ratios.append(compute[worst] / max(rest, 1e-9))
        lags.append(compute[worst] - rest)
        slowest[worst] += 1
    ratio = statistics.median(ratios)
    if ratio <= cfg.straggler_ratio or statistics.median(lags) < cfg.straggler_min_lag_seconds:
        return None
    rank, count = slowest.most_common(1)[0]
    return Verdict(DEGRADED,
                   f"straggler: rank {rank} computes {ratio:.2f}x slower than the others (limit "
                   f"{cfg.straggler_ratio:g}x) in {count} of the last {len(window)} steps; every rank waits for "
                   "it in all-reduce. Check that host's load, CPU throttling or its data partition",
                   {"kind": "straggler", "rank": rank, "ratio": ratio, "steps": [window[0]["step"], window[-1]["step"]]})


def _sync_bound(window, cfg) -> Verdict | None:
    # The smallest share across ranks: what remains after discounting waits for a straggler is the
    # all-reduce itself.
    shares = [min(s / max(t, 1e-9) for s, t in zip(r["sync_time"], r["step_time"])) for r in window]
    share = statistics.median(shares)
    if share <= cfg.max_sync_share:
        return None
    return Verdict(DEGRADED,
                   f"sync-bound: all-reduce takes {share:.0%} of each step (limit {cfg.max_sync_share:.0%}); "
                   "raise the per-worker batch size, use backward_passes_per_step > 1, enable fp16 "
                   "compression, or use fewer workers",
                   {"kind": "sync_share", "share": share, "steps": [window[0]["step"], window[-1]["step"]]})


def _finite(value) -> bool:
    # records.py writes NaN/Inf as the strings "nan"/"inf" so health.jsonl stays strict JSON
    return value is None or (isinstance(value, (int, float)) and math.isfinite(value))
