"""ringflow_retrain triggered the way the UI does it: a real Airflow (real_airflow.py: api-server, scheduler,
triggerer, dag-processor as separate processes) on 127.0.0.1, a token from the simple auth manager, the REST API.
"""
from __future__ import annotations

import json

import pytest
from real_airflow import running_airflow

pytestmark = [pytest.mark.service, pytest.mark.background, pytest.mark.timeout(900)]

DAG_ID = "ringflow_retrain"


@pytest.fixture
def airflow(airflow_db, dags_env, store, tmp_path):
    with running_airflow(dags_env, store, tmp_path, use_job_schedule=False) as instance:
        yield instance


def test_trigger_through_the_rest_api(airflow, store):
    airflow.log_in()
    assert airflow.request("GET", f"/api/v2/dags/{DAG_ID}", auth=False).status_code == 401
    airflow.unpause(DAG_ID)

    refused = airflow.request("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                              {"logical_date": None, "conf": {"num_workers": 0}})
    assert refused.status_code == 400, refused.text
    assert "num_workers" in refused.text

    response = airflow.request("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                               {"logical_date": None, "conf": {"epochs": 2, "model_name": "digits-rest"}})
    assert response.ok, response.text
    run_id = response.json()["dag_run_id"]

    state, summary = airflow.wait_for_run(DAG_ID, run_id, timeout=480)
    assert state == "success", f"{summary}\n{airflow.tail()}"
    assert set(summary.values()) == {"success"} and len(summary) == 5

    pointer = json.loads((store / "models" / "digits-rest" / "production.json").read_text())
    assert pointer["version"] == 1
    xcom = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/digits.promote/xcomEntries/"
                                  "return_value").json()
    assert xcom["value"]["promoted"] is True and xcom["value"]["version"] == 1
