"""Reading a run's health from Airflow: the records and the verdict on them, from the run's store."""
from __future__ import annotations

from typing import Any

from ringflow.training.config import HealthConfig
from ringflow.training.health.records import read_health
from ringflow.training.health.verdict import judge


def read_verdict(run_uri: str, health: dict[str, Any], conn_id: str | None, now: float | None,
                 watching_since: float | None = None) -> dict | None:
    """The verdict on the run so far (None before the job wrote anything). `now` enables the outside stall
    check: a job that stops writing health records for stall_seconds is STALLED even if it cannot say so.
    The silence is counted from `watching_since` at the earliest, so a retried job whose pods are still
    starting is not blamed for the quiet since its previous attempt."""
    from ringflow.operators.connections import open_store_for

    records = read_health(open_store_for(run_uri, conn_id))
    if not records:
        return None
    cfg = HealthConfig(**health)
    if now is not None and watching_since is not None:
        now -= max(0.0, watching_since - records[-1].get("time", watching_since))
    verdict = judge(records, cfg, now=now)
    return verdict.to_dict() | {"fatal": verdict.is_fatal(cfg.stop_on_degraded)}


def read_records(run_uri: str, conn_id: str | None) -> list[dict]:
    from ringflow.operators.connections import open_store_for

    return read_health(open_store_for(run_uri, conn_id))
