"""From a window of health records to one verdict with its evidence. Pure: no clocks, no I/O.

Record types (health.jsonl, one JSON object a line; see records.py). Each carries `attempt`, the launch
that wrote it (worker_env.ATTEMPT_ENV); a verdict only ever uses one attempt's records.
  start     an attempt begins: its step, what it resumed from, and its HealthConfig (the run's thresholds)
  step      per measured step: per-rank step/compute/sync seconds, loss, global gradient norm, non-finite flags
  checksum  every m steps: every rank's parameter checksum
  stall     a rank's watchdog saw no progress for stall_seconds
  store     a store operation the job waited for moved nothing for store_timeout_seconds, or failed
  oom       a rank ran out of memory: the OOM verdict's evidence (oom.py), written by rank 0 for itself
  checkpoint  a checkpoint was written (async: when its upload finished), with what it cost
  end       the attempt finished (succeeded or failed)

`stalled` and `store_unavailable` build the two liveness verdicts; liveness.py decides when, for the in-job
watchdog and the watcher outside the job alike, and a `stall` or `store` record carries the decision. `judge` reads a list of records; `HealthJudge` keeps the same
verdict's running state, so a watcher feeds it only new records and each poll costs the same however
long the run.

Verdicts, worst first: NONFINITE, DIVERGED, OOM, STALLED, STORE_UNAVAILABLE, DEGRADED, HEALTHY. The first
five are fatal; DEGRADED is fatal only when the job says so (health.stop_on_degraded).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter, deque
from typing import Any, Iterable, Mapping

from ..formats.config import STARTUP_SECONDS, HealthConfig

HEALTHY, DEGRADED, STALLED, DIVERGED, NONFINITE = "HEALTHY", "DEGRADED", "STALLED", "DIVERGED", "NONFINITE"
# The store, not the job: a store operation the job had to wait for moved nothing for
# health.store_timeout_seconds, or failed after every retry. Retried (a store comes back), never STALLED.
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
# A rank ran out of memory (oom.py: the evidence, how it is seen, the advice). Its record is `oom`.
OOM = "OOM"
# Not about health: a newer attempt claimed the run folder (run_folder.py), so this one stops and writes
# nothing more. Never in the records (a fenced attempt writes none); only in its log and exit status.
FENCED = "FENCED"
FATAL = (NONFINITE, DIVERGED, OOM, STALLED, STORE_UNAVAILABLE, FENCED)
# What a DEGRADED verdict found (its evidence's "kind"): a rank slower than the others, or an all-reduce
# that takes most of each step.
STRAGGLER, SYNC_BOUND = "straggler", "sync_share"
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

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> "Verdict | None":
        """A verdict as `to_dict` wrote it (other keys, such as a watch's `fatal`, ignored); None for none."""
        if not doc:
            return None
        return cls(doc["status"], doc.get("reason", ""), doc.get("evidence") or {})


def stall_limit(stall_seconds: float, starting: bool) -> float:
    """The silence allowed: stall_seconds, or at least STARTUP_SECONDS before the first step (`starting`)."""
    return max(stall_seconds, STARTUP_SECONDS) if starting else stall_seconds


def stalled(silent_seconds: float, limit_seconds: float | None, last_step: int | None, seen_by: str,
            rank: int | None = None, phase: str | None = None) -> Verdict | None:
    """STALLED when the training thread made no progress for more than `limit_seconds`
    (health.stall_seconds): no step completed, or, before the first step, the start-up phase moved nothing.

    `silent_seconds` never counts the time the training thread waited for a store that was still moving
    bytes (the store has its own verdict), nor the gaps between health records, which come only every
    health.every_steps steps. A limit of None means the silence was already judged (a `stall` record of a
    run too old to store its limit).
    """
    if limit_seconds is not None and not silent_seconds > limit_seconds:
        return None
    limit = f" (limit {limit_seconds:g}s)" if limit_seconds is not None else ""
    if last_step is not None:
        since = f"no step completed for {silent_seconds:.0f}s{limit} after step {last_step}"
    else:
        since = f"start-up ({phase or 'before the first step'}) made no progress for {silent_seconds:.0f}s{limit}"
    return Verdict(STALLED,
                   f"{since}, seen by {seen_by}: a rank hangs, the network is partitioned or the job is dead; "
                   "check the workers' logs and the hosts' connectivity",
                   {"rank": rank, "last_step": last_step, "seconds": silent_seconds, "limit": limit_seconds,
                    "seen_by": seen_by, "phase": phase})


def store_unavailable(store_uri: str, operation: str, waited_seconds: float, limit_seconds: float | None,
                      seen_by: str, error: str | None = None, last_step: int | None = None) -> Verdict:
    """STORE_UNAVAILABLE: the store, its operation and the time waited, and what to check."""
    if error:
        what = f"{operation} on {store_uri} failed after {waited_seconds:.0f}s: {error}"
    else:
        limit = f" (limit {limit_seconds:g}s, health.store_timeout_seconds)" if limit_seconds is not None else ""
        what = f"{operation} on {store_uri} moved nothing for {waited_seconds:.0f}s{limit}"
    return Verdict(STORE_UNAVAILABLE,
                   f"{what}, seen by {seen_by}; training itself was not stuck. Check the store (its server, "
                   "disk, load) and the network to it; the task is retried and resumes from the last checkpoint",
                   {"store": store_uri, "operation": operation, "seconds": waited_seconds, "limit": limit_seconds,
                    "seen_by": seen_by, "error": error, "last_step": last_step})


def judge(records: Iterable[Mapping[str, Any]], cfg: HealthConfig, attempt: str | None = None) -> Verdict:
    """The verdict on one attempt's records: `attempt`, or else the attempt that started last (a resumed
    run appends to the same health.jsonl, and an earlier attempt's trouble is not this one's)."""
    records = [r for r in records if attempt is None or r.get("attempt") == attempt]
    starts = [i for i, r in enumerate(records) if r.get("type") == "start"]
    if starts:
        own = records[starts[-1]].get("attempt")
        records = [records[starts[-1]]] + [r for r in records[starts[-1] + 1:] if _same_attempt(r, own)]
    for rule in (_nonfinite_in, _diverged_in, _oom_in, _stall_in, _store_in):
        verdict = next(filter(None, (rule(r, cfg) for r in records)), None)
        if verdict:
            return verdict
    steps = [r for r in records if r.get("type") == "step"]
    return _window_verdict(steps[-cfg.window_steps:], len(steps), cfg)


class HealthJudge:
    """`judge` kept up to date a few records at a time: fed records in order, in any chunks, its verdict
    equals judge() on all of them. It keeps the first NONFINITE/DIVERGED/STALLED finding and the last
    window_steps step records, so memory and time per record stay flat however long the run.

    It follows the attempt that started last (`attempt`); a watcher that knows which attempt is its own
    uses the verdict only once that attempt's `start` has been fed."""

    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self._begin(None)

    def _begin(self, attempt: str | None) -> None:
        self.attempt = attempt
        self.started = attempt is not None
        self.ended = False
        self._first: dict[str, Verdict] = {}
        self._window: deque = deque(maxlen=self.cfg.window_steps)
        self._steps = 0

    def feed(self, records: Iterable[Mapping[str, Any]]) -> "HealthJudge":
        for r in records:
            kind = r.get("type")
            if kind == "start":
                self._begin(r.get("attempt"))
                self.started = True
            elif not _same_attempt(r, self.attempt):
                continue  # a late write of an earlier attempt
            elif kind == "end":
                self.ended = True
            elif kind == "step":
                self._window.append(r)
                self._steps += 1
            for status, rule in ((NONFINITE, _nonfinite_in), (DIVERGED, _diverged_in), (OOM, _oom_in),
                                 (STALLED, _stall_in), (STORE_UNAVAILABLE, _store_in)):
                if status not in self._first:
                    verdict = rule(r, self.cfg)
                    if verdict:
                        self._first[status] = verdict
        return self

    def fatal(self) -> Verdict | None:
        """The worst fatal finding so far (NONFINITE, DIVERGED, OOM, STALLED, STORE_UNAVAILABLE), or None: without the window's
        statistics, so a caller that stops only on these can ask after every record."""
        for status in FATAL:
            if status in self._first:
                return self._first[status]
        return None

    def verdict(self) -> Verdict:
        return self.fatal() or _window_verdict(list(self._window), self._steps, self.cfg)

    @property
    def last_step(self) -> int | None:
        """The last step the attempt's step records show (None before its first)."""
        return self._window[-1]["step"] if self._window else None


def thresholds(records: Iterable[Mapping[str, Any]]) -> HealthConfig | None:
    """The HealthConfig the attempt that started last ran with (its `start` record), or None for a run
    written before runs stored their thresholds."""
    stored = None
    for r in records:
        if r.get("type") == "start":
            stored = r.get("health")
    if not isinstance(stored, Mapping):
        return None
    known = {f.name for f in dataclasses.fields(HealthConfig)}
    return HealthConfig(**{k: v for k, v in stored.items() if k in known})


def _same_attempt(r: Mapping[str, Any], attempt: str | None) -> bool:
    # Records of runs from before attempts were recorded carry none: they belong to whatever started last.
    return attempt is None or r.get("attempt") in (None, attempt)


def _window_verdict(window: list, steps_measured: int, cfg: HealthConfig) -> Verdict:
    if len(window) >= min(MIN_STEPS_FOR_DEGRADED, cfg.window_steps):
        for check in (_straggler, _sync_bound):
            verdict = check(window, cfg)
            if verdict:
                return verdict
    last = window[-1]["step"] if window else None
    return Verdict(HEALTHY, "no sign of trouble", {"last_step": last, "steps_measured": steps_measured})


def _nonfinite_in(r, cfg) -> Verdict | None:
    if r.get("type") == "checksum" and not all(_finite(s) for s in r["checksums"]):
        # A NaN/Inf gradient applied between two measurements (health.nonfinite_every_step off).
        ranks = [rank for rank, s in enumerate(r["checksums"]) if not _finite(s)]
        return Verdict(NONFINITE,
                       f"NaN/Inf in the parameters of rank(s) {ranks} at step {r['step']}: lower the learning "
                       "rate, check the input data for NaN/Inf, or clip gradients; resume from the last "
                       "checkpoint (it was written before)", {"step": r["step"], "ranks": ranks})
    # A script's steps (training/api.py) may carry no gradient norm: None is "not measured", not NaN.
    if r.get("type") == "step" and (r.get("nonfinite_ranks") or ("grad_norm" in r and r["grad_norm"] is not None
                                                                 and not _finite(r["grad_norm"]))):
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


def _diverged_in(r, cfg) -> Verdict | None:
    sums = r.get("checksums") if r.get("type") == "checksum" else None
    if not sums or not all(_finite(s) for s in sums):
        return None  # NaN/Inf parameters are NONFINITE's finding, and outrank this one
    diffs = [abs(s - sums[0]) / max(1.0, abs(sums[0])) for s in sums]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    if diffs[worst] > cfg.divergence_tolerance:
        return Verdict(DIVERGED,
                       f"replica on rank {worst} differs from rank 0 at step {r['step']} (relative "
                       f"difference {diffs[worst]:.3g} > {cfg.divergence_tolerance:g}): parameters were "
                       "changed outside the synchronized optimizer step; restart from the last checkpoint",
                       {"step": r["step"], "rank": worst, "checksums": sums, "relative_difference": diffs[worst]})
    return None


def _oom_in(r, cfg) -> Verdict | None:
    if r.get("type") != "oom":
        return None
    return Verdict(OOM, r.get("reason", ""), r.get("evidence") or {})


def _stall_in(r, cfg) -> Verdict | None:
    if r.get("type") != "stall":
        return None
    rank = r.get("rank")
    return stalled(r["seconds"], r.get("limit"), r.get("last_step"), f"the watchdog of rank {rank}", rank=rank,
                   phase=r.get("phase"))


def _store_in(r, cfg) -> Verdict | None:
    if r.get("type") != "store":
        return None
    return store_unavailable(r["store"], r["operation"], r["seconds"], r.get("limit"), r.get("seen_by", "the job"),
                             error=r.get("error"), last_step=r.get("last_step"))


def slowest_rank(compute: list[float]) -> tuple[int, float, float]:
    """Of one step's per-rank compute times (two ranks or more): the slowest rank, its time as a multiple
    of the others' median, and by how many seconds it exceeds that median. The straggler verdict and the
    task log's health summary (core/runs/health_summary.py) both read a step this way."""
    worst = max(range(len(compute)), key=compute.__getitem__)
    rest = statistics.median(compute[:worst] + compute[worst + 1:])
    return worst, compute[worst] / max(rest, 1e-9), compute[worst] - rest


def _straggler(window, cfg) -> Verdict | None:
    ratios, lags, slowest = [], [], Counter()
    for r in window:
        compute = r["compute_time"]
        if len(compute) < 2:
            return None
        worst, ratio, lag = slowest_rank(compute)
        ratios.append(ratio)
        lags.append(lag)
        slowest[worst] += 1
    ratio = statistics.median(ratios)
    if ratio <= cfg.straggler_ratio or statistics.median(lags) < cfg.straggler_min_lag_seconds:
        return None
    rank, count = slowest.most_common(1)[0]
    return Verdict(DEGRADED,
                   f"straggler: rank {rank} computes {ratio:.2f}x slower than the others (limit "
                   f"{cfg.straggler_ratio:g}x) in {count} of the last {len(window)} steps; every rank waits for "
                   "it in all-reduce. Check that host's load, CPU throttling or its data partition",
                   {"kind": STRAGGLER, "rank": rank, "ratio": ratio, "steps": [window[0]["step"], window[-1]["step"]]})


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
                   {"kind": SYNC_BOUND, "share": share, "steps": [window[0]["step"], window[-1]["step"]]})


def _finite(value) -> bool:
    # records.py writes NaN/Inf as the strings "nan"/"inf" so health.jsonl stays strict JSON
    return value is None or (isinstance(value, (int, float)) and math.isfinite(value))
