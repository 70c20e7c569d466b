"""`remediation: "auto"` end to end for the two faults the chain-of-faults DAG run does not walk
(docs/guides/fault-table.md): a sync-bound try and a store outage, each injected in a real 2-worker job of 1
epoch on the local backend, the train task driven as Airflow drives it (execute, the trigger's one event, execute_complete; the
retry's execute with try_number 2), each run converging to HEALTHY and promoted. No whole-DAG run: CI time.

Both runs keep their run folders in one S3 bucket (the S3 test server, moto) behind a fault proxy
(tests/s3_fault_proxy.py), reached through the `ringflow_s3` connection, as a deployment's MinIO would be: the
module's fixture builds it once; the sync test leaves the proxy alone."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import types

import pytest
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from s3_fault_proxy import FaultProxy

from ringflow.operators.evaluate import EvaluateModelOperator
from ringflow.operators.promote import PromoteModelOperator
from ringflow.operators.train import TrainOperator
from ringflow.training.core.backends.local import LocalProcessBackend
from ringflow.training.core.remediation import RemedyName

CONN_ID = "ringflow_s3"
DAG_ID = "ringflow_remediation"
# A digits step computes in a millisecond or two, so even a healthy step's exposed all-reduce (mostly the wait
# for the peer on a shared host) is most of it: up to 84 % measured here, against the default limit of 85 %.
# The sync test's limit sits above that noise; every rank's all-reduce wait made SLOW_SYNC_SECONDS longer
# (faults: slow_sync) is still well over it (a share of 0.996 measured with 0.5 s).
MAX_SYNC_SHARE = 0.95
SLOW_SYNC_SECONDS = 1.0
# For the same reason a rank's compute lags the other's by milliseconds, several times over, as the shared host
# schedules them: a straggler is a lag longer than this here (the default, 5 ms, is for real steps). The
# sync-bound fault adds nothing to compute.
STRAGGLER_MIN_LAG_SECONDS = 0.05


@pytest.fixture(scope="module")
def proxied_bucket(s3_server):
    """(proxy, bucket, settings): a fresh bucket, the `ringflow_s3` connection pointing at a FaultProxy in front
    of it, and the S3 settings of the same route for the test's own reads."""
    bucket = s3_server.new_bucket("rf-remedy")
    with FaultProxy(s3_server.endpoint) as proxy, pytest.MonkeyPatch.context() as monkeypatch:
        conn = {"conn_type": "aws", "login": s3_server.access_key, "password": s3_server.secret_key,
                "extra": {"endpoint_url": proxy.endpoint, "region_name": s3_server.region}}
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
        for var in ("RINGFLOW_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(var, raising=False)
        yield proxy, bucket, s3_server.settings(endpoint=proxy.endpoint)


def context(run_id: str, try_number: int, task_id: str = "train"):
    return {"ti": types.SimpleNamespace(dag_id=DAG_ID, run_id=run_id, task_id=task_id, try_number=try_number,
                                        map_index=-1)}


def deferred(call, *args, **kwargs) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as raised:
        call(*args, **kwargs)
    return raised.value


def first_event(trigger) -> dict:
    """The trigger's one event, as the triggerer stores it."""
    async def run():
        async for event in trigger.run():
            return event.payload

    return json.loads(json.dumps(asyncio.run(run())))


def train_operator(tmp_path, manifest: str, store: str, run_id: str, **kwargs) -> TrainOperator:
    return TrainOperator(task_id="train", manifest_uri=manifest, run_uri=f"{store}/runs/{run_id}", conn_id=CONN_ID,
                         backend=LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2,
                                                     conn_id=CONN_ID),
                         epochs=1, **kwargs)


def failed_try(op: TrainOperator, ctx: dict, event: dict) -> str:
    """execute_complete on a failed try: retried (not failed for good); the task's message."""
    with pytest.raises(AirflowException) as failed:
        op.execute_complete(ctx, event)
    assert not isinstance(failed.value, AirflowFailException), failed.value
    return str(failed.value)


def launched_config(tmp_path, run_uri: str, try_number: int) -> dict:
    """The job.json the local backend launched for try `try_number` of the run."""
    configs = [json.loads(p.read_text()) for p in (tmp_path / "jobs").glob(f"*-t{try_number}/job.json")]
    (config,) = [c for c in configs if c["run_uri"] == run_uri]
    return config


def checkpoint_published(run) -> bool:
    """Whether the run folder lists a published checkpoint yet (the job trains, and a retry has one to resume)."""
    from ringflow.training.formats.run_folder import RunFolder

    try:
        return bool(RunFolder(run).checkpoints().names())
    except Exception:  # noqa: BLE001 - nothing written yet
        return False


def evaluate_and_promote(store: str, run_uri: str, run_id: str, model: str) -> dict:
    EvaluateModelOperator(task_id="evaluate", run_uri=run_uri, conn_id=CONN_ID).execute(
        context(run_id, 1, "evaluate"))
    return PromoteModelOperator(task_id="promote", name=model, store_uri=store, run_uri=run_uri,
                                conn_id=CONN_ID).execute(context(run_id, 1, "promote"))


def assert_healthy_and_promoted(out: dict, promoted: dict, remedy: str, verdict: str) -> None:
    assert out["status"] == "succeeded" and out["verdict"]["status"] == "HEALTHY", out
    assert [(r["try"], r["verdict"], r["remedy"]) for r in out["remedies"]] == [(2, verdict, remedy)]
    assert promoted["promoted"] and promoted["version"] == 1, promoted
    assert promoted["checkpoint"] == out["checkpoint"]


@pytest.mark.pipeline
@pytest.mark.background  # mostly waits (1 s syncs, a held store): beside the main lane (scripts/test.sh)
@pytest.mark.timeout(600)
def test_a_sync_bound_try_is_retried_with_wider_buckets_and_promoted(tmp_path, digits_manifest, proxied_bucket):
    """Try 1: every rank's all-reduce wait is SLOW_SYNC_SECONDS longer; health sees a sync-bound step and, with
    health.stop_on_degraded, the job stops DEGRADED (sync). Try 2 runs with DDP's bucket doubled and no fault
    (on_try 1): HEALTHY, promoted."""
    _, bucket, _ = proxied_bucket
    store, run_id = f"s3://{bucket}", "manual__sync"
    slow_sync = [{"kind": "slow_sync", "rank": rank, "step": 1, "seconds": SLOW_SYNC_SECONDS} for rank in (0, 1)]
    op = train_operator(tmp_path, digits_manifest, store, run_id, engine="ddp", job_config={
        "remediation": "auto", "health": {"stop_on_degraded": True, "every_steps": 2, "max_sync_share": MAX_SYNC_SHARE,
                   "straggler_min_lag_seconds": STRAGGLER_MIN_LAG_SECONDS},
        "faults": slow_sync})

    ctx = context(run_id, 1)
    event = first_event(deferred(op.execute, ctx).trigger)
    said = failed_try(op, ctx, event)
    assert "health verdict DEGRADED: sync-bound" in said and "ddp.bucket_cap_mb 25 -> 50" in said, said
    assert event["verdict"]["evidence"]["kind"] == "sync_share" and event["verdict"]["evidence"]["share"] > MAX_SYNC_SHARE

    ctx = context(run_id, 2)
    out = op.execute_complete(ctx, first_event(deferred(op.execute, ctx).trigger))
    retried = launched_config(tmp_path, op.run_uri, 2)
    assert retried["ddp"]["bucket_cap_mb"] == 50 and retried["faults"] == []
    assert launched_config(tmp_path, op.run_uri, 1)["ddp"]["bucket_cap_mb"] == 25
    assert_healthy_and_promoted(out, evaluate_and_promote(store, op.run_uri, run_id, "digits-sync"),
                                RemedyName.WIDER_BUCKETS, "DEGRADED/sync_share")


@pytest.mark.pipeline
@pytest.mark.background  # mostly waits (1 s syncs, a held store): beside the main lane (scripts/test.sh)
@pytest.mark.timeout(600)
def test_a_store_outage_waits_deferred_then_launches_and_promotes(tmp_path, digits_manifest, proxied_bucket):
    """Try 1's writes to its run folder are held once its first checkpoint is published (the store takes no
    writes): after health.store_timeout_seconds the verdict is STORE_UNAVAILABLE. The store comes back; the retry
    defers on the wait the remedy planned, holding no worker slot; the deferred launch (the method the
    TimeDeltaTrigger resumes, called without its 60 s) resumes from try 1's checkpoint, trains HEALTHY and is
    promoted."""
    from ringflow.training.store import S3Store

    proxy, bucket, settings = proxied_bucket
    store, run_id = f"s3://{bucket}", "manual__store"
    # Both ranks paced alike (no straggler) on try 1 only, so the outage lands while it trains. Health measures
    # every 10th step (the default): the outage, not the ranks' pace on a shared host, is what this test judges.
    paced = [{"kind": "slow_rank", "rank": rank, "step": 1, "seconds": 0.5} for rank in (0, 1)]
    op = train_operator(tmp_path, digits_manifest, store, run_id, job_config={
        "remediation": "auto", "checkpoint": {"every_steps": 5}, "faults": paced,
        "health": {"store_timeout_seconds": 4, "heartbeat_seconds": 1}})
    run = S3Store.from_settings(bucket, f"runs/{run_id}", settings)
    held = []

    def hold_writes_once_training():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not checkpoint_published(run):
            time.sleep(0.2)
        held.append(proxy.hold("PUT", rf"/{bucket}/runs/{run_id}/"))

    ctx = context(run_id, 1)
    watch = deferred(op.execute, ctx).trigger
    outage = threading.Thread(target=hold_writes_once_training, daemon=True)
    outage.start()
    try:
        event = first_event(watch)
    finally:
        outage.join(5)
        for hold in held:
            hold.release()  # the store comes back
    assert held and held[0].held > 0, "the outage never held a write"
    said = failed_try(op, ctx, event)
    assert "STORE_UNAVAILABLE" in said and "wait 60s" in said, said

    ctx = context(run_id, 2)
    wait = deferred(op.execute, ctx)
    assert isinstance(wait.trigger, TimeDeltaTrigger) and wait.method_name == "launch_after_wait"
    assert not list((tmp_path / "jobs").glob("*-t2")), "launched during the wait"
    launch = deferred(op.launch_after_wait, ctx, event=None)
    assert launch.method_name == "execute_complete"
    out = op.execute_complete(ctx, first_event(launch.trigger))
    assert launched_config(tmp_path, op.run_uri, 2)["faults"] == []
    assert out["resumed_from"] is not None  # from the last checkpoint try 1 published
    assert_healthy_and_promoted(out, evaluate_and_promote(store, op.run_uri, run_id, "digits-store"),
                                RemedyName.WAIT_FOR_STORE, "STORE_UNAVAILABLE")

