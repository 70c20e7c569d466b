"""The approval question (subject and body) built from a run and production, the answer read back from the event
Airflow resumes the task with, and the approve task's checks. A real Airflow answering it: tests/dags/
test_approval_rest.py."""
from __future__ import annotations

import datetime as dt
import json

import pytest

from evaluated_runs import make_run

from ringflow.operators.approval import (
    ApprovalRequest,
    PromotionApprovalOperator,
    approval_body,
    approval_subject,
    read_answer,
    read_request,
)
from ringflow.operators.promote import PromoteModelOperator
from ringflow.training.core.gate import Gate
from ringflow.training.core.registry.model_registry import Pointer
from ringflow.training.store import LocalFolderStore

DAY = dt.timedelta(hours=24)


def pointer(version: int, **metrics) -> Pointer:
    return Pointer(version=version, sha256={}, run_uri=f"s3://b/runs/r{version}", checkpoint="ckpt-40",
                   metrics=metrics, promoted_at="2026-11-30T10:00:00+00:00", previous=None)


def request(metrics, production=None, verdict="HEALTHY", gate=Gate(), timeout=DAY) -> ApprovalRequest:
    return ApprovalRequest(model_name="digits-mlp", run_uri="s3://b/runs/r9", metrics=metrics, verdict=verdict,
                           verdict_reason="gradients in sync" if verdict else "", gate=gate,
                           production=production, timeout=timeout)


@pytest.mark.parametrize("req, subject, in_body", [
    (request({"accuracy": 0.95, "loss": 0.2}),
     "Promote digits-mlp? accuracy 0.95, HEALTHY",
     ["| **accuracy** (the gate's; higher is better) | 0.95 | — | — |", "| loss | 0.2 | — | — |",
      "No model is in production yet.", "Health verdict of the training run: **HEALTHY**: gradients in sync",
      "Promotion gate: passes (accuracy, higher is better, no worse than production).",
      "No answer within 1 day, 0:00:00: rejected, nothing is promoted."]),
    (request({"accuracy": 0.95, "loss": 0.2}, production=pointer(3, accuracy=0.9, loss=0.25)),
     "Promote digits-mlp? accuracy 0.95 vs 0.9 in production (v3), HEALTHY",
     ["| metric | this run | production v3 | change |",
      "| **accuracy** (the gate's; higher is better) | 0.95 | 0.9 | +0.05 (better) |",
      "| loss | 0.2 | 0.25 | -0.05 |",  # not the gate's metric: no judgement
      "In production: version 3, from run `s3://b/runs/r3` (promoted 2026-11-30T10:00:00+00:00)."]),
    # min mode: lower is better, and a metric production never had
    (request({"loss": 0.3, "mse": 1.5}, production=pointer(2, loss=0.35), verdict="DEGRADED",
             gate=Gate(metric="loss", mode="min", threshold=0.4), timeout=dt.timedelta(hours=2)),
     "Promote digits-mlp? loss 0.3 vs 0.35 in production (v2), DEGRADED",
     ["| **loss** (the gate's; lower is better) | 0.3 | 0.35 | -0.05 (better) |", "| mse | 1.5 | — | — |",
      "threshold 0.4", "within 2:00:00"]),
    (request({"accuracy": 0.9}, production=pointer(1, accuracy=0.9), verdict=None, gate=Gate(allowed_verdicts=None),
             timeout=None),
     "Promote digits-mlp? accuracy 0.9 vs 0.9 in production (v1), no verdict",
     ["| 0.9 | 0.9 | same |", "**none** (health monitoring was off)", "This waits for an answer for ever."]),
])
def test_the_question_shows_metrics_verdict_and_production(req, subject, in_body):
    assert approval_subject(req) == subject
    body = approval_body(req)
    for text in in_body:
        assert text in body, f"{text!r} not in\n{body}"
    assert "**Approve**: the promote task runs" in body and "**Reject**: nothing is promoted" in body


@pytest.mark.parametrize("req, refusal", [
    (request({"accuracy": 0.95}, production=pointer(1, accuracy=0.9)), None),
    (request({"accuracy": 0.85}, production=pointer(1, accuracy=0.9)), "worse than production version 1"),
    (request({"accuracy": 0.95}, verdict="UNHEALTHY"), "verdict is 'UNHEALTHY'"),
    (request({"accuracy": 0.95}, gate=Gate(threshold=0.97)), "does not reach the threshold"),
])
def test_the_request_knows_what_promotes_gate_says(req, refusal):
    assert req.refusal is None if refusal is None else refusal in req.refusal


@pytest.mark.parametrize("kwargs, match", [
    ({"metrics": {"loss": 0.2}}, "have no 'accuracy'"),
    ({"metrics": {"accuracy": 0.9}, "timeout": dt.timedelta(0)}, "positive datetime.timedelta"),
    ({"metrics": {"accuracy": 0.9}, "timeout": 3600}, "positive datetime.timedelta"),
])
def test_a_request_that_cannot_be_asked_says_what_to_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        request(**kwargs)


AT = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("event, approved, by, timed_out, message", [
    ({"chosen_options": ["Approve"], "responded_by_user": {"id": "u7", "name": "alice"}, "responded_at": AT,
      "timedout": False}, True, "alice", False, "approved by alice: promote runs"),
    ({"chosen_options": ["Reject"], "responded_by_user": {"id": "bob", "name": ""}, "responded_at": AT},
     False, "bob", False, "rejected by bob: nothing promoted"),
    # the scheduler's timeout sweep answers with the default (Reject) and no user
    ({"chosen_options": ["Reject"], "responded_by_user": None, "responded_at": AT, "timedout": True},
     False, None, True, "no answer before the approval timeout: rejected by default"),
])
def test_the_answer_names_who_gave_it(event, approved, by, timed_out, message):
    answer = read_answer(event)
    assert (answer.approved, answer.responded_by, answer.timed_out) == (approved, by, timed_out)
    assert answer.responded_at == AT.isoformat()
    xcom = answer.to_xcom("digits-mlp")
    assert message in xcom["message"] and xcom["asked"] is True
    json.dumps(xcom)  # an XCom value


@pytest.mark.parametrize("chosen", [[], ["Approve", "Reject"], ["Maybe"]])
def test_an_answer_that_is_not_one_option_is_an_error(chosen):
    with pytest.raises(ValueError, match="exactly one of"):
        read_answer({"chosen_options": chosen, "responded_by_user": {"id": "a", "name": "a"}})


def test_the_request_is_read_from_the_run_folder_and_the_registry(tmp_path):
    uri, store = str(tmp_path / "ml"), LocalFolderStore(tmp_path / "ml")
    first = read_request(uri, f"{uri}/runs/{make_run(store, 'r1', 0.9)}", None, "digits", Gate(), DAY)
    assert (first.metrics, first.verdict, first.verdict_reason, first.production) == (
        {"accuracy": 0.9, "loss": pytest.approx(0.1)}, "HEALTHY", "as judged", None)
    PromoteModelOperator(task_id="promote", name="digits", store_uri=uri, run_uri=f"{uri}/runs/r1",
                         conn_id=None).execute(context={})
    second = read_request(uri, f"{uri}/runs/{make_run(store, 'r2', 0.95)}", None, "digits", Gate(), DAY)
    assert second.production.version == 1 and second.production.metrics["accuracy"] == 0.9
    assert "| 0.95 | 0.9 | +0.05 (better) |" in approval_body(second)


def test_a_run_the_gate_refuses_is_put_to_nobody(tmp_path):
    """No HITL request is written (that would need a running task): the task returns at once."""
    uri, store = str(tmp_path / "ml"), LocalFolderStore(tmp_path / "ml")
    op = PromotionApprovalOperator(task_id="approve", name="digits", store_uri=uri, conn_id=None,
                                   run_uri=f"{uri}/runs/{make_run(store, 'r1', 0.9, verdict='UNHEALTHY')}")
    out = op.execute(context={})
    assert out["asked"] is False and out["approved"] is False and "'UNHEALTHY'" in out["reason"]


def test_the_operator_asks_with_reject_as_the_timeout_answer():
    op = PromotionApprovalOperator(task_id="approve", name="digits", store_uri="s3://b", run_uri="s3://b/runs/r",
                                   approvers=["alice", "bob"], response_timeout=dt.timedelta(hours=2))
    assert (op.options, op.defaults, op.multiple) == (["Approve", "Reject"], ["Reject"], False)
    assert op.assigned_users == [{"id": "alice", "name": "alice"}, {"id": "bob", "name": "bob"}]
    assert op.response_timeout == dt.timedelta(hours=2)
    assert PromotionApprovalOperator(task_id="a", name="d", store_uri="s3://b", run_uri="r").assigned_users is None


@pytest.mark.parametrize("kwargs, match", [
    ({"response_timeout": dt.timedelta(seconds=-1)}, "approval_timeout is"),
    ({"approvers": "alice"}, "list of user ids"),
    ({"approvers": ["alice", ""]}, "list of user ids"),
    ({"mode": "median"}, "gate mode is 'median'"),
])
def test_bad_arguments_say_what_to_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PromotionApprovalOperator(task_id="approve", name="digits", store_uri="s3://b", run_uri="s3://b/runs/r",
                                  **kwargs)
