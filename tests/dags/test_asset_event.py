"""Data-driven runs, proven on a real Airflow (real_airflow.py: api-server, scheduler, triggerer and
dag-processor on 127.0.0.1): a new digits file lands at the dataset asset's URI, an asset event is posted
through the REST API (`POST /api/v2/assets/events`, what an ingestion job outside Airflow would do), and
ringflow_retrain_on_asset runs on its own and promotes the model."""
from __future__ import annotations

import json

import pytest
from real_airflow import drop_digits

pytestmark = [pytest.mark.service, pytest.mark.background, pytest.mark.timeout(900)]

DAG_ID = "ringflow_retrain_on_asset"


def test_an_asset_event_runs_the_pipeline_and_promotes(real_airflow):
    airflow, store = real_airflow, real_airflow.store
    drop = drop_digits(store)
    airflow.unpause(DAG_ID)

    uri = f"file://{drop}"
    def asset_id():
        assets = airflow.request("GET", "/api/v2/assets", None).json()["assets"]
        return next((a["id"] for a in assets if a["uri"] == uri), None)

    found = airflow.wait_for(f"the asset {uri}", asset_id, timeout=60, interval=2)
    assert not asset_runs(airflow)  # none before the event (the browser test triggers this DAG by hand)
    response = airflow.request("POST", "/api/v2/assets/events", {"asset_id": found, "extra": {"rows": 1797}})
    assert response.ok, response.text

    def a_run():
        runs = asset_runs(airflow)
        return runs[0] if runs else None

    run = airflow.wait_for(f"{DAG_ID} to be triggered by the event", a_run, timeout=120, interval=2)
    assert run["run_type"] == "asset_triggered", run
    run_id = run["dag_run_id"]

    state, summary = airflow.wait_for_run(DAG_ID, run_id, timeout=600)
    assert state == "success", f"{summary}\n{airflow.tail()}"
    xcom = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/digits.validate/"
                                  "xcomEntries/return_value").json()
    assert xcom["value"]["rows"] == 1797, xcom  # it validated the dropped file
    xcom = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/digits.promote/"
                                  "xcomEntries/return_value").json()
    assert xcom["value"]["promoted"] is True and xcom["value"]["version"] == 1, xcom
    pointer = json.loads((store / "models" / "digits-mlp" / "production.json").read_text())
    assert pointer["version"] == 1 and run_id.replace(":", "_").replace("+", "_") in pointer["run_uri"]


def asset_runs(airflow) -> list[dict]:
    runs = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
    return [r for r in runs if r["run_type"] == "asset_triggered"]
