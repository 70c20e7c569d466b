"""A TrainJob's `status.trainerStatus` (Kubeflow Trainer v2.2+, feature gate TrainJobStatus): what rank 0 reports
of its progress, and when. Pure: the body of the status patch, the progress and remaining-time estimates and the
throttle; the rank's reporter (rank/trainer_status_reporter.py) sends what these build. No torch, no Kubernetes
client, no Airflow.

    status:
      trainerStatus:
        progressPercentage: 0..100           (int32; absent when unknown)
        estimatedRemainingSeconds: >= 0      (int32; absent when unknown)
        metrics: [{name, value}]             (strings of 1..64 characters, at most 256 items, replaced whole)
        lastUpdatedTime: RFC 3339            (required whenever trainerStatus is present)

Progress counts rows of the data order (epochs x rows of an epoch), not optimizer steps nor micro-batches: a
resume, on the same or another number of workers or per-worker batch, continues the same count (the settled
cursor names the rows of the epoch left), so the percentage never jumps back.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Mapping

# At most one update every this many seconds (the rule): the API server is shared, progress is coarse.
MIN_INTERVAL_SECONDS = 5.0
MAX_METRICS = 256
MAX_METRIC_CHARS = 64
INT32_MAX = 2**31 - 1
# The TrainJob's name and namespace in the rank's environment: the runtimes pass the pod's JobSet label (the JobSet
# is named like its TrainJob) and its namespace through the downward API (deploy/trainer/).
TRAINJOB_NAME_ENV = "RINGFLOW_TRAINJOB_NAME"
TRAINJOB_NAMESPACE_ENV = "RINGFLOW_TRAINJOB_NAMESPACE"
# What the reporter calls, exactly (deploy/training-rbac.yaml's Role for the training pods grants this and nothing more).
API_CALLS = (("trainer.kubeflow.org", "trainjobs/status", "patch"),)


@dataclasses.dataclass(frozen=True)
class TrainerStatus:
    """One report. progress_percentage / estimated_remaining_seconds None: unknown (left out of the patch)."""
    progress_percentage: int | None
    estimated_remaining_seconds: int | None
    metrics: Mapping[str, str]
    last_updated: datetime.datetime

    def __post_init__(self) -> None:
        p = self.progress_percentage
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 100):
            raise ValueError(f"progress_percentage is {p!r}; use a whole number 0..100, or None when unknown")
        r = self.estimated_remaining_seconds
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= INT32_MAX):
            raise ValueError(f"estimated_remaining_seconds is {r!r}; use a whole number >= 0, or None when unknown")
        if self.last_updated.tzinfo is None:
            raise ValueError("last_updated has no time zone; give an aware datetime (UTC)")
        if len(self.metrics) > MAX_METRICS:
            raise ValueError(f"{len(self.metrics)} metrics; the TrainJob keeps at most {MAX_METRICS}")
        for name, value in self.metrics.items():
            for what, text in (("name", name), ("value", value)):
                if not isinstance(text, str) or not 1 <= len(text) <= MAX_METRIC_CHARS:
                    raise ValueError(f"metric {what} {text!r} must be a string of 1..{MAX_METRIC_CHARS} characters "
                                     f"(build metrics with metric_values)")

    def patch_body(self) -> dict:
        """The JSON merge patch (RFC 7386) of the TrainJob's status subresource: trainerStatus whole, an unknown
        estimate as null, which removes what an earlier report said (metrics are an atomic list: replaced)."""
        return {"status": {"trainerStatus": {
            "progressPercentage": self.progress_percentage,
            "estimatedRemainingSeconds": self.estimated_remaining_seconds,
            "metrics": [{"name": k, "value": v} for k, v in self.metrics.items()],
            "lastUpdatedTime": self.last_updated.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }}}


def due(now: float, last_attempt: float | None, interval: float = MIN_INTERVAL_SECONDS) -> bool:
    """Whether an update may be sent at `now` (monotonic seconds): the first always, then once `interval` has
    passed since the last attempt, sent or failed (a failure waits for the next tick like a success)."""
    return last_attempt is None or now - last_attempt >= interval


def progress_percentage(done: int, total: int) -> int | None:
    """Whole percent of the data order done, rounded down (100 only when every row is); None when the total is
    unknown."""
    if total <= 0:
        return None
    return max(0, min(100, done * 100 // total))


def remaining_seconds(done: int, total: int, done_this_attempt: int,
                      seconds_this_attempt: float) -> int | None:
    """The rest of the data order at this attempt's own rate so far (a resumed attempt's earlier rows ran at
    another speed, maybe on another number of workers); None until this attempt has done a row."""
    if total <= 0 or done_this_attempt <= 0 or seconds_this_attempt <= 0:
        return None
    left = max(0, total - done)
    return min(INT32_MAX, math.ceil(left * seconds_this_attempt / done_this_attempt))


def metric_values(metrics: Mapping[str, float | int | str]) -> dict[str, str]:
    """Metrics as the TrainJob keeps them: strings of at most 64 characters (numbers to 6 significant digits,
    non-finite ones as nan/inf), the first MAX_METRICS names."""
    out = {}
    for name, value in list(metrics.items())[:MAX_METRICS]:
        if isinstance(value, float):
            text = f"{value:.6g}" if math.isfinite(value) else repr(value)
        else:
            text = str(value)
        out[str(name)[:MAX_METRIC_CHARS]] = text[:MAX_METRIC_CHARS] or "-"
    return out
