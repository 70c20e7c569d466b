"""A person approves (or rejects) a promotion: Airflow's human-in-the-loop ApprovalOperator between evaluate
and promote, asking with what the run earned.

    evaluate >> approve >> promote        (pipeline_tasks(..., require_approval=True))

The question (the HITL detail's subject and body, shown in the UI's "Required actions" and by
`GET /api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails`) is built here in Python
from the run folder and the registry, not by templates: the eval metrics next to production's, the change,
the health verdict and what promote's gate says.

    Approve  promote runs (and asks the gate again, against production as it is then).
    Reject   promote is skipped (ApprovalOperator's own behaviour): nothing is promoted. The approve task's
             log and XCom name who rejected it; so does the HITL detail (`responded_by_user`).
    timeout  no answer within `response_timeout` (default DEFAULT_APPROVAL_TIMEOUT): Airflow's scheduler
             takes the default answer, Reject, so nothing is promoted; the log and XCom say it timed out.
             None waits for ever.

A run the gate refuses is not put to anyone: there is nothing a person could approve. The approve task says
so and lets promote run, which records the refusal as it does without approval.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any, Mapping, Sequence

from airflow.providers.standard.operators.hitl import ApprovalOperator

from ringflow.operators.connections import DEFAULT_S3_CONN_ID
from ringflow.operators.promote import GateArguments, evaluated_run
from ringflow.training.core.gate import DEFAULT_ALLOWED_VERDICTS, Gate
from ringflow.training.core.registry.model_registry import ModelRegistry, Pointer

DEFAULT_APPROVAL_TIMEOUT = dt.timedelta(hours=24)
APPROVE, REJECT = ApprovalOperator.APPROVE, ApprovalOperator.REJECT


@dataclasses.dataclass(frozen=True)
class ApprovalRequest:
    """What a person is asked to approve: the run's metrics and verdict, the gate, production now."""

    model_name: str
    run_uri: str
    metrics: Mapping[str, Any]
    verdict: str | None
    verdict_reason: str
    gate: Gate
    production: Pointer | None
    timeout: dt.timedelta | None

    def __post_init__(self) -> None:
        if self.gate.metric not in self.metrics:
            raise ValueError(f"eval metrics {sorted(self.metrics)} have no {self.gate.metric!r}, the gate's metric; "
                             f"set the gate's metric to one of them")
        check_timeout(self.timeout)

    @property
    def refusal(self) -> str | None:
        """Why promote's gate refuses this run now (None: it passes)."""
        return self.gate.check(self.verdict, dict(self.metrics), self.production)


def check_timeout(timeout: Any) -> None:
    if timeout is not None and (not isinstance(timeout, dt.timedelta) or timeout <= dt.timedelta(0)):
        raise ValueError(f"approval_timeout is {timeout!r}; use a positive datetime.timedelta (e.g. "
                         f"timedelta(hours=24)), or None to wait for an answer for ever")


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "—" if value is None else str(value)
    return f"{value:.4g}"


def _change(value: Any, current: Any, mode: str | None) -> str:
    """`+0.012 (better)`, for the gate's metric; the plain difference for the others."""
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) for v in (value, current)):
        return "—"
    delta = value - current
    text = f"{delta:+.4g}"
    if mode is None or delta == 0:
        return text if delta else "same"
    return f"{text} ({'better' if (delta > 0) == (mode == 'max') else 'worse'})"


def approval_subject(request: ApprovalRequest) -> str:
    metric = request.gate.metric
    subject = f"Promote {request.model_name}? {metric} {_number(request.metrics[metric])}"
    if request.production is not None:
        subject += (f" vs {_number(request.production.metrics.get(metric))} in production "
                    f"(v{request.production.version})")
    return f"{subject}, {request.verdict or 'no verdict'}"


def approval_body(request: ApprovalRequest) -> str:
    """The question in Markdown: a table of this run's metrics against production's, the verdict, the gate."""
    gate, production = request.gate, request.production
    better = "higher" if gate.mode == "max" else "lower"
    names = [gate.metric] + sorted(n for n in request.metrics if n != gate.metric)
    prod_head = f"production v{production.version}" if production else "production"
    lines = [f"Promote the checkpoint of run `{request.run_uri}` as model **{request.model_name}**?", "",
             f"| metric | this run | {prod_head} | change |", "|---|---|---|---|"]
    for name in names:
        current = production.metrics.get(name) if production else None
        label = f"**{name}** (the gate's; {better} is better)" if name == gate.metric else name
        lines.append(f"| {label} | {_number(request.metrics[name])} | {_number(current)} | "
                     f"{_change(request.metrics[name], current, gate.mode if name == gate.metric else None)} |")
    verdict = f"**{request.verdict}**" if request.verdict else "**none** (health monitoring was off)"
    lines += ["", f"Health verdict of the training run: {verdict}"
              + (f": {request.verdict_reason}" if request.verdict_reason else "")]
    if production is None:
        lines.append("No model is in production yet.")
    else:
        lines.append(f"In production: version {production.version}, from run `{production.run_uri}` "
                     f"(promoted {production.promoted_at}).")
    lines.append(f"Promotion gate: passes ({gate.metric}, {better} is better"
                 + (f", threshold {gate.threshold:g}" if gate.threshold is not None else "")
                 + (", no worse than production" if gate.compare_to_production else "") + ").")
    wait = (f"No answer within {request.timeout}: rejected, nothing is promoted." if request.timeout
            else "This waits for an answer for ever.")
    lines += ["", f"**{APPROVE}**: the promote task runs and checks the gate once more against production as it "
                  f"is then. **{REJECT}**: nothing is promoted. {wait}"]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Answer:
    """The response, as the resumed task got it."""

    approved: bool
    responded_by: str | None  # the user's name (id if it has none); None when the timeout answered
    responded_at: str | None
    timed_out: bool

    def message(self, model_name: str) -> str:
        if self.approved:
            return f"promotion of model {model_name!r} approved by {self.responded_by}: promote runs"
        if self.timed_out:
            return (f"no answer before the approval timeout: rejected by default, model {model_name!r} is not "
                    f"promoted (promote is skipped)")
        return f"promotion of model {model_name!r} rejected by {self.responded_by}: nothing promoted (promote is skipped)"

    def to_xcom(self, model_name: str) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "asked": True, "message": self.message(model_name)}


def read_answer(event: Mapping[str, Any]) -> Answer:
    """The Answer from the event Airflow resumes the task with (models.hitl.HITLDetail.as_resume_event_payload:
    chosen_options, responded_by_user {"id", "name"} or None, responded_at, timedout)."""
    chosen = list(event.get("chosen_options") or [])
    if len(chosen) != 1 or chosen[0] not in (APPROVE, REJECT):
        raise ValueError(f"approval answer is {chosen!r}; expected exactly one of {[APPROVE, REJECT]}")
    user = event.get("responded_by_user")
    if user is not None and not isinstance(user, Mapping):
        user = {"id": getattr(user, "id", None), "name": getattr(user, "name", None)}
    responder = (user.get("name") or user.get("id")) if user else None
    at = event.get("responded_at")
    timed_out = bool(event.get("timedout")) or responder is None
    return Answer(approved=chosen[0] == APPROVE, responded_by=responder,
                  responded_at=at.isoformat() if isinstance(at, dt.datetime) else at, timed_out=timed_out)


def read_request(store_uri: str, run_uri: str, conn_id: str | None, model_name: str, gate: Gate,
                 timeout: dt.timedelta | None) -> ApprovalRequest:
    """The request from the run folder (result.json, eval.json) and the registry's production pointer."""
    store, run = evaluated_run(store_uri, run_uri, conn_id)
    return ApprovalRequest(model_name=model_name, run_uri=run_uri, metrics=dict(run.metrics), verdict=run.verdict,
                           verdict_reason=run.result.verdict.reason if run.result.verdict else "", gate=gate,
                           production=ModelRegistry(store).production(model_name), timeout=timeout)


class PromotionApprovalOperator(GateArguments, ApprovalOperator):
    """Ask a person to approve promoting the run in `run_uri` (see the module docstring).

    The gate arguments are promote's (PromoteModelOperator), so the question says what promote will decide.
    approvers: the auth manager's user ids allowed to answer (None: anyone who may edit the DAG's HITL
    details). Returns (XCom) `{"asked", "approved", "responded_by", "responded_at", "timed_out", "message"}`;
    `{"asked": False, "reason"}` when the gate refuses and nobody is asked.
    """

    # Not subject and body: they are built when the task runs, from the run folder and the registry.
    template_fields: Sequence[str] = ("name", "store_uri", "run_uri", "conn_id", "metric", "mode", "threshold")

    def __init__(self, *, name: str, store_uri: str, run_uri: str, conn_id: str | None = DEFAULT_S3_CONN_ID,
                 metric: str = "accuracy", mode: str = "max", threshold: float | str | None = None,
                 compare_to_production: bool = True,
                 allowed_verdicts: Sequence[str] | None = DEFAULT_ALLOWED_VERDICTS,
                 response_timeout: dt.timedelta | None = DEFAULT_APPROVAL_TIMEOUT,
                 approvers: Sequence[str] | None = None, **kwargs: Any) -> None:
        check_timeout(response_timeout)
        if approvers is not None and (isinstance(approvers, str) or not all(isinstance(a, str) and a
                                                                            for a in approvers)):
            raise ValueError(f"approvers is {approvers!r}; give a list of user ids (the simple auth manager's are "
                             f"user names), or None to let anyone who may edit the DAG answer")
        super().__init__(subject=f"Promote {name}?", defaults=[REJECT], response_timeout=response_timeout,
                         assigned_users=[{"id": a, "name": a} for a in approvers] if approvers else None, **kwargs)
        self.name, self.store_uri, self.run_uri, self.conn_id = name, store_uri, run_uri, conn_id
        self.keep_gate_arguments(metric=metric, mode=mode, threshold=threshold,
                                 compare_to_production=compare_to_production, allowed_verdicts=allowed_verdicts)

    def execute(self, context: Any) -> Any:
        request = read_request(self.store_uri, self.run_uri, self.conn_id, self.name, self.gate,
                               self.response_timeout)
        if (refusal := request.refusal) is not None:
            reason = f"not asking anyone to approve: promote's gate refuses the run ({refusal}); promote records it"
            self.log.warning("%s", reason)
            return {"asked": False, "approved": False, "reason": reason}
        self.subject, self.body = approval_subject(request), approval_body(request)
        self.log.info("asking to approve: %s", self.subject)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        if "error" in event:
            return super().execute_complete(context, event)  # raises the HITL error (timeout without default)
        answer = read_answer(event)
        outcome = answer.to_xcom(self.name)
        # Logged and pushed before the base class acts on the answer: on Reject it skips promote by raising
        # (DownstreamTasksSkipped), or fails with fail_on_reject, so nothing returned would reach XCom.
        (self.log.info if answer.approved else self.log.warning)("%s", outcome["message"])
        context["ti"].xcom_push(key="return_value", value=outcome)
        super().execute_complete(context, event)
        return outcome
