"""The approval gate on a real Airflow (real_airflow.py: api-server, scheduler, triggerer and dag-processor on
127.0.0.1), answered through the REST API as a reviewer's tool would: the approve task of
dags/ringflow_retrain_approved.py waits in `awaiting_input`, its HITL detail shows the eval metrics, the health
verdict and production's figures, and `PATCH .../hitlDetails` answers it.

On the run's one real Airflow (tests/dags/conftest.py real_airflow): run 1 approved (promote runs, production is version 1),
run 2 rejected (nothing promoted, the approve task names the rejecter), and meanwhile a test DAG whose approval
times out after a few seconds (the scheduler answers Reject: nothing promoted).
"""
from __future__ import annotations

import json

import pytest
from real_airflow import TIMEOUT_DAG_ID

pytestmark = [pytest.mark.service, pytest.mark.background, pytest.mark.timeout(1500)]

DAG_ID = "ringflow_retrain_approved"
APPROVE = "digits.approve"


@pytest.fixture
def airflow(real_airflow):
    """The shared real Airflow; it parses the test DAG whose approval times out (real_airflow.TIMEOUT_DAG)."""
    return real_airflow


def trigger(airflow, dag_id: str, conf: dict) -> str:
    response = airflow.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    assert response.ok, response.text
    return response.json()["dag_run_id"]


def task_path(dag_id: str, run_id: str, task_id: str = APPROVE) -> str:
    return f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"


def wait_for_question(airflow, dag_id: str, run_id: str) -> dict:
    """The HITL detail, once the approve task waits for an answer."""
    def waiting():
        ti = airflow.request("GET", task_path(dag_id, run_id)).json()
        assert ti.get("state") not in ("failed", "upstream_failed", "skipped"), f"{ti}\n{airflow.tail()}"
        return ti.get("state") == "awaiting_input"

    airflow.wait_for(f"{run_id}'s approve task to wait for an answer", waiting, timeout=600, interval=3)
    airflow.wait_for_process_end_seen(dag_id, run_id, APPROVE)  # answering sooner trips an Airflow race
    detail = airflow.request("GET", task_path(dag_id, run_id) + "/-1/hitlDetails")
    assert detail.ok, detail.text
    return detail.json()


def answer(airflow, run_id: str, option: str) -> dict:
    response = airflow.request("PATCH", task_path(DAG_ID, run_id) + "/-1/hitlDetails", {"chosen_options": [option]})
    assert response.ok, response.text
    return response.json()


def xcom(airflow, dag_id: str, run_id: str, task_id: str) -> dict:
    return airflow.request("GET", task_path(dag_id, run_id, task_id) + "/xcomEntries/return_value").json()["value"]


def task_log(airflow, dag_id: str, run_id: str, task_id: str) -> str:
    return airflow.task_log(dag_id, run_id, task_id)


def test_approve_promotes_reject_does_not_and_a_timeout_rejects(airflow):
    store = airflow.store
    airflow.unpause(DAG_ID)
    airflow.unpause(TIMEOUT_DAG_ID)
    pointer_file = store / "models" / "digits-approved" / "production.json"

    # Run 1: nothing in production yet; approved.
    first = trigger(airflow, DAG_ID, {"epochs": 1, "model_name": "digits-approved"})
    detail = wait_for_question(airflow, DAG_ID, first)
    assert detail["options"] == ["Approve", "Reject"] and detail["defaults"] == ["Reject"], detail
    assert detail["subject"].startswith("Promote digits-approved? accuracy "), detail["subject"]
    body = detail["body"]
    assert "| **accuracy** (the gate's; higher is better) |" in body and "| loss |" in body, body
    assert "Health verdict of the training run: **HEALTHY**" in body, body
    assert "No model is in production yet." in body, body
    assert not pointer_file.exists()  # nothing promoted while it waits
    response = answer(airflow, first, "Approve")
    assert response["responded_by"]["name"] == "ringflow"
    state, summary = airflow.wait_for_run(DAG_ID, first, timeout=300)
    assert state == "success" and summary[APPROVE] == summary["digits.promote"] == "success", \
        f"{summary}\n{airflow.tail()}"
    production = json.loads(pointer_file.read_text())
    assert production["version"] == 1
    assert xcom(airflow, DAG_ID, first, "digits.promote")["promoted"] is True
    approved = xcom(airflow, DAG_ID, first, APPROVE)
    assert (approved["approved"], approved["responded_by"], approved["timed_out"]) == (True, "ringflow", False)

    # Run 2 (longer training, so at least as good as production and put to a person), and meanwhile a run whose
    # approval times out.
    second = trigger(airflow, DAG_ID, {"epochs": 3, "model_name": "digits-approved"})
    timing_out = trigger(airflow, TIMEOUT_DAG_ID, {})
    detail = wait_for_question(airflow, DAG_ID, second)
    body = detail["body"]
    assert "| metric | this run | production v1 | change |" in body, body
    assert f"| {production['metrics']['accuracy']:.4g} |" in body, body  # production's accuracy, beside this run's
    assert "in production (v1)" in detail["subject"], detail["subject"]
    answer(airflow, second, "Reject")
    state, summary = airflow.wait_for_run(DAG_ID, second, timeout=300)
    assert state == "success" and summary[APPROVE] == "success" and summary["digits.promote"] == "skipped", \
        f"{summary}\n{airflow.tail()}"
    assert json.loads(pointer_file.read_text()) == production  # nothing promoted
    rejected = xcom(airflow, DAG_ID, second, APPROVE)
    assert (rejected["approved"], rejected["responded_by"], rejected["timed_out"]) == (False, "ringflow", False)
    assert "rejected by ringflow: nothing promoted" in task_log(airflow, DAG_ID, second, APPROVE)
    detail = airflow.request("GET", task_path(DAG_ID, second) + "/-1/hitlDetails").json()
    assert detail["responded_by_user"]["name"] == "ringflow" and detail["chosen_options"] == ["Reject"]

    state, summary = airflow.wait_for_run(TIMEOUT_DAG_ID, timing_out, timeout=600)
    assert state == "success" and summary["digits.promote"] == "skipped", f"{summary}\n{airflow.tail()}"
    timed_out = xcom(airflow, TIMEOUT_DAG_ID, timing_out, APPROVE)
    assert (timed_out["approved"], timed_out["responded_by"], timed_out["timed_out"]) == (False, None, True)
    assert "no answer before the approval timeout" in task_log(airflow, TIMEOUT_DAG_ID, timing_out, APPROVE)
    assert not (store / "models" / "digits-timeout" / "production.json").exists()
