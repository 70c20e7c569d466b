"""The promote and rollback operators (called with .execute(context={}), no scheduler), and the
Airflow connection they read S3 settings from. Races between promote tasks: exact interleavings
(another task runs just before this one's pointer write) and many task processes released at once."""
from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from evaluated_runs import make_run
from promotion_race import race

import ringflow.operators.promote as promote_module
from ringflow.operators.connections import S3ConnectionError, open_store_for, s3_settings_from_connection
from ringflow.operators.promote import PromoteModelOperator, PromotionGateFailed, RollbackModelOperator
from ringflow.training.core.registry.model_registry import ModelRegistry, RegistryError
from ringflow.training.store import LocalFolderStore, S3Store, StoreConfigError


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


@pytest.mark.job
def test_promote_and_rollback_on_s3_with_the_connection_from_the_environment(s3_server, s3_connection):
    bucket = s3_server.new_bucket()
    store = S3Store.from_settings(bucket, "ml", s3_server.settings())
    uri = f"s3://{bucket}/ml"
    assert promote(uri, make_run(store, "r1", 0.90))["version"] == 1
    assert promote(uri, make_run(store, "r2", 0.95), conn_id=s3_connection)["version"] == 2
    assert not promote(uri, make_run(store, "r3", 0.50))["promoted"]
    assert store.get_bytes("models/digits/v2/state.pt") == b"weights of r2"
    RollbackModelOperator(task_id="rollback", name="digits", store_uri=uri).execute(context={})
    assert json.loads(store.get_bytes("models/digits/production.json"))["version"] == 1


# -- racing promotions ---------------------------------------------------------------------------

class BeforePointerWrite:
    """The store, except that `before()` runs once, just before the first conditional write of
    production.json: another task lands between this task's gate check and its pointer write."""

    def __init__(self, store, before):
        self._store, self._before, self.fired = store, before, False

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if name not in ("put_bytes_if_absent", "put_bytes_if_match"):
            return attr

        def hooked(key, *args):
            if not self.fired and key.endswith("production.json"):
                self.fired = True
                self._before()
            return attr(key, *args)
        return hooked


def racing_store(monkeypatch, store, before):
    racing = BeforePointerWrite(store, before)
    monkeypatch.setattr(promote_module, "open_store_for", lambda uri, conn_id: racing)
    return racing


@pytest.mark.parametrize("fail_on_gate", [False, True])
def test_a_run_that_becomes_worse_than_production_while_promoting_is_not_promoted(local, monkeypatch, fail_on_gate):
    uri, store = local
    promote(uri, make_run(store, "r0", 0.80))
    make_run(store, "better", 0.95)
    landed = []
    racing = racing_store(monkeypatch, store, lambda: landed.append(promote(uri, "better")))
    # 0.90 beats version 1 (0.80) when read; "better" (0.95) lands before this task's pointer write.
    if fail_on_gate:
        with pytest.raises(PromotionGateFailed, match=r"worse than production version 3 \(0\.95.*stay in the registry "
                                                       r"as version 2, not in production"):
            promote(uri, make_run(store, "good", 0.90), fail_on_gate=True)
    else:
        outcome = promote(uri, make_run(store, "good", 0.90))
        assert (outcome["promoted"], outcome["version"], outcome["previous"]) == (False, 2, 3)
        assert "accuracy 0.9 is worse than production version 3 (0.95" in outcome["reason"]
    assert racing.fired and landed[0]["promoted"] and landed[0]["version"] == 3
    registry = ModelRegistry(store)
    assert registry.production("digits").version == 3 and registry.versions("digits") == [1, 2, 3]
    assert [(p.version, p.replaced) for p in registry.history("digits")] == [(1, None), (3, 1)]


def test_a_run_still_better_than_what_landed_meanwhile_is_promoted_over_it(local, monkeypatch):
    uri, store = local
    make_run(store, "first", 0.85)
    racing_store(monkeypatch, store, lambda: promote(uri, "first"))
    outcome = promote(uri, make_run(store, "best", 0.95))
    assert (outcome["promoted"], outcome["version"], outcome["previous"]) == (True, 1, 2)
    history = ModelRegistry(store).history("digits")
    assert [(p.version, p.metrics["accuracy"]) for p in history] == [(2, 0.85), (1, 0.95)]


def test_a_rollback_task_fails_rather_than_roll_back_a_version_that_landed_meanwhile(local, monkeypatch):
    uri, store = local
    promote(uri, make_run(store, "r1", 0.90))
    promote(uri, make_run(store, "r2", 0.95))
    make_run(store, "r3", 0.97)
    racing_store(monkeypatch, store, lambda: promote(uri, "r3"))
    # Failed for good: a retry would read production afresh and roll back version 3 instead.
    with pytest.raises(AirflowFailException, match="production is version 3 .*not version 2"):
        RollbackModelOperator(task_id="rollback", name="digits", store_uri=uri).execute(context={})
    monkeypatch.undo()
    assert ModelRegistry(store).production("digits").version == 3
    with pytest.raises(AirflowFailException, match="not version 2"):
        RollbackModelOperator(task_id="rollback", name="digits", store_uri=uri, from_version=2).execute(context={})
    pointer = RollbackModelOperator(task_id="rollback", name="digits", store_uri=uri,
                                    from_version=3).execute(context={})
    assert (pointer["version"], pointer["replaced"], pointer["revision"]) == (2, 3, 4)


ACCURACIES = [0.83, 0.87, 0.81, 0.90, 0.85, 0.88, 0.80, 0.86]  # in the order the runs are listed


# On S3 only (its conditional writes over HTTP, the connection): the local folder keeps the same conditional-write
# contract (tests/training/store/test_store_contract.py runs it on both, across processes too), and the registry's
# own race on it is tests/training/core/registry/test_model_registry.py's.
@pytest.mark.job
def test_many_promote_tasks_at_once_keep_the_best_and_an_explainable_history(s3_server, s3_connection):
    conn_id, bucket = s3_connection, s3_server.new_bucket()
    uri, store = f"s3://{bucket}/ml", S3Store.from_settings(bucket, "ml", s3_server.settings())
    runs = [make_run(store, f"r{i}", acc) for i, acc in enumerate(ACCURACIES)]
    outcomes = race([{"operator": {"name": "digits", "store_uri": uri, "run_uri": f"{uri}/runs/{run}",
                                   "conn_id": conn_id}} for run in runs])
    assert all("error" not in o for o in outcomes), outcomes
    registry = ModelRegistry(store)
    history = registry.history("digits")
    # Explainable: revisions 1, 2, ... each replacing the version before it, and (with a "no worse
    # than production" gate and no rollback) never a step down in accuracy.
    assert [p.revision for p in history] == list(range(1, len(history) + 1)) and history[0].replaced is None
    assert all(b.replaced == a.version for a, b in zip(history, history[1:]))
    accuracies = [p.metrics["accuracy"] for p in history]
    assert accuracies == sorted(accuracies) and accuracies[-1] == max(ACCURACIES)
    assert registry.production("digits") == history[-1]
    # No update lost: every task that says it promoted is in the history, exactly once...
    promoted = [o for o in outcomes if o["promoted"]]
    assert sorted(o["version"] for o in promoted) == sorted(p.version for p in history)
    by_version = {p.version: p for p in history}
    assert all(by_version[o["version"]].replaced == o["previous"] for o in promoted)
    assert all(by_version[o["version"]].metrics["accuracy"] == o["value"] for o in promoted)
    # ...and every other one was refused against a version that really was better.
    for o in outcomes:
        if not o["promoted"]:
            assert "worse than production version" in o["reason"], o
            better = registry.model_info("digits", int(o["reason"].split("production version ")[1].split()[0]))
            assert better["metrics"]["accuracy"] > o["value"]
    # Every version (promoted or not) distinct and complete, holding its own run's checkpoint.
    copied = [o["version"] for o in outcomes if o["version"] is not None]
    assert len(set(copied)) == len(copied) and sorted(copied) == registry.versions("digits")
    for version in copied:
        run = registry.model_info("digits", version)["source"]["run_uri"].rsplit("/", 1)[1]
        assert store.get_bytes(f"models/digits/v{version}/state.pt") == f"weights of {run}".encode()


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
    # conn_id None: no connection, the environment's S3 settings (here: none, so it says which to set).
    for var in ("RINGFLOW_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(StoreConfigError, match="needs RINGFLOW_S3_ENDPOINT.*set in the environment"):
        open_store_for("s3://bucket/ml", None)
    monkeypatch.setenv("RINGFLOW_S3_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    assert isinstance(open_store_for("s3://bucket/ml", None), S3Store)  # opened lazily: no request yet
    # Local stores need no connection at all.
    assert isinstance(open_store_for(str(tmp_path), None), LocalFolderStore)


def test_the_gate_is_built_when_the_task_runs(local):
    """Templated gate values are checked once rendered; plain ones when the DAG is parsed."""
    uri, store = local
    run = make_run(store, "r1", 0.9)
    op = PromoteModelOperator(task_id="promote", name="digits", store_uri=uri, run_uri=f"{uri}/runs/{run}",
                              metric="{{ params.gate_metric }}", mode="{{ params.gate_mode }}",
                              threshold="{{ params.gate_threshold }}")
    assert {"metric", "mode", "threshold"} <= set(op.template_fields)
    op.metric, op.mode, op.threshold = "accuracy", "max", "0.95"  # what rendering gives
    refused = op.execute(context={})
    assert not refused["promoted"] and "does not reach the threshold (>= 0.95)" in refused["reason"]
    op.threshold = "0.5"
    assert op.execute(context={})["promoted"]
    op.mode = "best"
    with pytest.raises(ValueError, match="gate mode is 'best'"):
        op.execute(context={})
