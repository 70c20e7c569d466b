"""Data-driven runs, proven on a real Airflow (the api-server, scheduler, triggerer and dag-processor of
test_rest_api.py, on 127.0.0.1): a new digits file lands at the dataset asset's URI, an asset event is posted
through the REST API (`POST /api/v2/assets/events`, what an ingestion job outside Airflow would do), and
ringflow_retrain_on_asset runs on its own and promotes the model."""
from __future__ import annotations

import json
import os
import secrets

import pytest
from test_rest_api import Airflow, _free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DAG_ID = "ringflow_retrain_on_asset"


@pytest.fixture
def airflow(airflow_db, dags_env, store, tmp_path):
    """test_rest_api.py's Airflow, but with the scheduler creating runs (asset-triggered runs are made where
    scheduled ones are); every DAG starts paused, so only the one unpaused here can run."""
    port = _free_port()
    passwords = tmp_path / "passwords.json"
    env = {**os.environ, **dags_env,
           "RINGFLOW_STORE": str(store),
           "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__WORKERS": "1",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
           "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
           "AIRFLOW__CORE__AUTH_MANAGER":
               "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "ringflow:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
           "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
           "AIRFLOW__CORE__PARALLELISM": "3",
           "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True",
           "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True"}
    logs = tmp_path / "logs"
    logs.mkdir()
    instance = Airflow(env, logs, port)
    instance.passwords = passwords
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


def test_an_asset_event_runs_the_pipeline_and_promotes(airflow, store):
    from ringflow.training.datasets import load_builtin

    drop = store / "datasets" / "digits.parquet"  # the asset's URI (dags/ringflow_retrain.py DIGITS_DROP)
    drop.parent.mkdir(parents=True)
    load_builtin("digits").to_parquet(drop, index=False)

    airflow.wait_for("the API server", lambda: airflow.request("GET", "/api/v2/monitor/health", auth=False).ok,
                     timeout=180)
    password = airflow.wait_for("the generated password", lambda: airflow.passwords.exists() and json.loads(
        airflow.passwords.read_text() or "{}").get("ringflow"), timeout=30)
    response = airflow.request("POST", "/auth/token", {"username": "ringflow", "password": password}, auth=False)
    assert response.status_code == 201, response.text
    airflow.token = response.json()["access_token"]
    airflow.wait_for("the DAG to be parsed", lambda: airflow.request("GET", f"/api/v2/dags/{DAG_ID}").ok,
                     timeout=180, interval=2)
    response = airflow.request("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    assert response.ok and response.json()["is_paused"] is False, response.text

    uri = f"file://{drop}"
    def asset_id():
        assets = airflow.request("GET", "/api/v2/assets", None).json()["assets"]
        return next((a["id"] for a in assets if a["uri"] == uri), None)

    found = airflow.wait_for(f"the asset {uri}", asset_id, timeout=60, interval=2)
    assert not airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]  # nothing before
    response = airflow.request("POST", "/api/v2/assets/events", {"asset_id": found, "extra": {"rows": 1797}})
    assert response.ok, response.text

    def a_run():
        runs = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
        return runs[0] if runs else None

    run = airflow.wait_for(f"{DAG_ID} to be triggered by the event", a_run, timeout=120, interval=2)
    assert run["run_type"] == "asset_triggered", run
    run_id = run["dag_run_id"]

    def finished():
        state = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    state = airflow.wait_for(f"run {run_id} to finish", finished, timeout=600, interval=3)
    tis = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    summary = {ti["task_id"]: ti["state"] for ti in tis}
    assert state == "success", f"{summary}\n{airflow.tail()}"
    xcom = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/digits.validate/"
                                  "xcomEntries/return_value").json()
    assert xcom["value"]["rows"] == 1797, xcom  # it validated the dropped file
    xcom = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/digits.promote/"
                                  "xcomEntries/return_value").json()
    assert xcom["value"]["promoted"] is True and xcom["value"]["version"] == 1, xcom
    pointer = json.loads((store / "models" / "digits-mlp" / "production.json").read_text())
    assert pointer["version"] == 1 and run_id.replace(":", "_").replace("+", "_") in pointer["run_uri"]
