"""The promote and rollback operators (called with .execute(context={}), no scheduler), and the
Airflow connection they read S3 settings from."""
from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowException

from ringflow.operators.connections import S3ConnectionError, open_store_for, s3_settings_from_connection
from ringflow.operators.model_registry import ModelRegistry, RegistryError
from ringflow.operators.promote import PromoteModelOperator, PromotionGateFailed, RollbackModelOperator
from ringflow.training.checkpoint import CheckpointStore
from ringflow.training.store import LocalFolderStore, MinioStore


def make_run(store, run_id, accuracy, *, status="succeeded", verdict="HEALTHY", step=40):
    """A run folder as the train and evaluate tasks leave it."""
    run = store.child(f"runs/{run_id}")
    ckpt = CheckpointStore(run).save(step, {"state.pt": f"weights of {run_id}".encode()}, {})
    run.put_bytes("result.json", json.dumps({"status": status, "checkpoint": ckpt,
                                             "verdict": {"status": verdict, "reasons": []}}).encode())
    run.put_bytes("eval.json", json.dumps({"metrics": {"accuracy": accuracy, "loss": 1 - accuracy}}).encode())
    return run_id


@pytest.fixture
def local(tmp_path):
    return str(tmp_path / "ml"), LocalFolderStore(tmp_path / "ml")


def promote(store_uri, run_id, **kwargs):
    op = PromoteModelOperator(task_id="promote", name="digits", store_uri=store_uri,
                              run_uri=f"{store_uri}/runs/{run_id}", **kwargs)
    return op.execute(context={})


def test_a_better_run_is_promoted_and_a_worse_one_is_not(local):
    uri, store = local
    first = promote(uri, make_run(store, "r1", 0.90))
    assert first["promoted"] and first["version"] == 1 and first["previous"] is None

    second = promote(uri, make_run(store, "r2", 0.95))
    assert (second["promoted"], second["version"], second["previous"]) == (True, 2, 1)

    worse = promote(uri, make_run(store, "r3", 0.80))
    assert not worse["promoted"] and worse["version"] is None
    assert "accuracy 0.8 is worse than production version 2 (0.95" in worse["reason"]
    assert ModelRegistry(store).production("digits").version == 2
    assert ModelRegistry(store).versions("digits") == [1, 2]

    # Rerunning the promote task of a promoted run is harmless.
    again = promote(uri, "r2")
    assert (again["promoted"], again["version"], again["new_version"]) == (True, 2, False)


def test_fail_on_gate_fails_the_task_instead(local):
    uri, store = local
    promote(uri, make_run(store, "r1", 0.90))
    with pytest.raises(PromotionGateFailed, match="worse than production version 1"):
        promote(uri, make_run(store, "r2", 0.85), fail_on_gate=True)


@pytest.mark.parametrize("kwargs, accuracy, verdict, promoted, reason", [
    ({}, 0.9, "DEGRADED", True, ""),
    ({}, 0.9, "UNHEALTHY", False, "health verdict is 'UNHEALTHY'"),
    ({"allowed_verdicts": None}, 0.9, "UNHEALTHY", True, ""),
    ({}, 0.9, None, False, "no health verdict"),  # trained with health monitoring off
    ({"allowed_verdicts": None}, 0.9, None, True, ""),
    ({"threshold": 0.95}, 0.9, "HEALTHY", False, "does not reach the threshold (>= 0.95)"),
    ({"metric": "loss", "mode": "min", "threshold": 0.2}, 0.9, "HEALTHY", True, ""),
    ({"metric": "loss", "mode": "min", "threshold": 0.05}, 0.9, "HEALTHY", False, "(<= 0.05)"),
])
def test_gate_on_verdict_and_threshold(local, kwargs, accuracy, verdict, promoted, reason):
    uri, store = local
    outcome = promote(uri, make_run(store, "r1", accuracy, verdict=verdict), **kwargs)
    assert outcome["promoted"] is promoted and reason in outcome["reason"]


def test_min_mode_compares_with_production(local):
    uri, store = local
    promote(uri, make_run(store, "r1", 0.90), metric="loss", mode="min")
    outcome = promote(uri, make_run(store, "r2", 0.85), metric="loss", mode="min")  # loss 0.15 > 0.10
    assert not outcome["promoted"] and "min is better" in outcome["reason"]


def test_runs_that_did_not_succeed_or_lack_files_are_errors(local):
    uri, store = local
    with pytest.raises(AirflowException, match="only a succeeded run"):
        promote(uri, make_run(store, "failed", 0.99, status="failed"))
    make_run(store, "no-eval", 0.9)
    store.delete("runs/no-eval/eval.json")
    with pytest.raises(AirflowException, match="eval.json does not exist: the evaluate task did not run"):
        promote(uri, "no-eval")
    with pytest.raises(AirflowException, match="result.json does not exist"):
        promote(uri, "never-ran")
    with pytest.raises(AirflowException, match=r"no metric 'f1' \(metrics: \['accuracy', 'loss'\]\)"):
        promote(uri, make_run(store, "r1", 0.9), metric="f1")
    with pytest.raises(ValueError, match="gate mode"):
        PromoteModelOperator(task_id="p", name="m", store_uri=uri, run_uri=uri, mode="best")


def test_a_run_outside_the_registry_store_is_refused(local, tmp_path):
    uri, store = local
    op = PromoteModelOperator(task_id="promote", name="digits", store_uri=uri, run_uri=str(tmp_path / "other/runs/r1"))
    with pytest.raises(RegistryError, match="not inside the registry's store"):
        op.execute(context={})


def test_rollback_operator(local):
    uri, store = local
    promote(uri, make_run(store, "r1", 0.90))
    promote(uri, make_run(store, "r2", 0.95))
    pointer = RollbackModelOperator(task_id="rollback", name="digits", store_uri=uri).execute(context={})
    assert (pointer["version"], pointer["action"]) == (1, "rollback")
    assert ModelRegistry(store).production("digits").version == 1
    pointer = RollbackModelOperator(task_id="rollback", name="digits", store_uri=uri, to_version=2).execute(context={})
    assert pointer["version"] == 2


@pytest.mark.slow
def test_promote_and_rollback_on_s3_with_the_connection_from_the_environment(s3_server, s3_connection):
    bucket = s3_server.new_bucket()
    store = MinioStore.from_settings(bucket, "ml", s3_server.settings())
    uri = f"s3://{bucket}/ml"
    assert promote(uri, make_run(store, "r1", 0.90))["version"] == 1
    assert promote(uri, make_run(store, "r2", 0.95), conn_id=s3_connection)["version"] == 2
    assert not promote(uri, make_run(store, "r3", 0.50))["promoted"]
    assert store.get_bytes("models/digits/v2/state.pt") == b"weights of r2"
    RollbackModelOperator(task_id="rollback", name="digits", store_uri=uri).execute(context={})
    assert json.loads(store.get_bytes("models/digits/production.json"))["version"] == 1


# -- connections ---------------------------------------------------------------------------------

def set_conn(monkeypatch, **conn):
    monkeypatch.setenv("AIRFLOW_CONN_TEST_S3", json.dumps(conn))


def test_settings_come_from_the_connection(monkeypatch):
    set_conn(monkeypatch, conn_type="aws", login="key-id", password="secret-key",
             extra={"endpoint_url": "http://minio.data.svc:9000", "region_name": "eu-west-1"})
    settings = s3_settings_from_connection("test_s3")
    assert (settings.endpoint, settings.access_key, settings.secret_key, settings.region) == (
        "http://minio.data.svc:9000", "key-id", "secret-key", "eu-west-1")
    assert "secret-key" not in repr(settings)


@pytest.mark.parametrize("conn, match", [
    ({"conn_type": "aws", "login": "k", "password": "s"}, 'lacks extra "endpoint_url"'),
    ({"conn_type": "aws", "extra": {"endpoint_url": "http://m:9000"}}, r"lacks login \(the access key\), password"),
    ({"conn_type": "aws", "login": "k", "password": "s", "extra": {"endpoint_url": "minio:9000"}},
     "not a URL like http://"),
    ({"conn_type": "postgres", "login": "k", "password": "s"}, "make it type 'aws'"),
])
def test_connection_errors_say_what_to_set(monkeypatch, conn, match):
    set_conn(monkeypatch, **conn)
    with pytest.raises(S3ConnectionError, match=match):
        s3_settings_from_connection("test_s3")


def test_missing_connection_and_missing_conn_id(monkeypatch, tmp_path):
    monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
    with pytest.raises(S3ConnectionError, match="AIRFLOW_CONN_NOWHERE"):
        s3_settings_from_connection("nowhere")
    with pytest.raises(S3ConnectionError, match="no conn_id was given"):
        open_store_for("s3://bucket/ml", None)
    # Local stores need no connection at all.
    assert isinstance(open_store_for(str(tmp_path), None), LocalFolderStore)
