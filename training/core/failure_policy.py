"""What becomes of one attempt of a training job: succeed, retry, fail without retry, and whether to stop it.

One pure function, `decide`, over what is known of the attempt (an `Observation`): the job's state as its
backend sees it, the exit status its processes reported, its own RunResult, the health verdict watched from
outside, whether it ran past its timeout, and whether the task refused it before launch. Every layer asks
it instead of reading a RunResult its own way:

- the launcher (`ringflow train`): the exit status (`Decision.exit_code`);
- the trigger: whether there is anything to decide yet (WATCH: keep watching), and then it reports the
  Observation (core/observe.py) in its one event and stops nothing;
- the next try (core/attempts.py, for the operator's `execute_complete` and `ringflow train --retries`):
  whether there is one and what it changes; the operator stops the job when `stop_job` says so.

The rows (tests/training/core/test_failure_policy.py, docs/guides/reliability.md "Failure policy") are what these layers did
one by one before: the job's own result wins over the exit status the process layers made of it (mpirun and
torchrun report any rank's failure as 1); a NaN or a divergence is not retried, because a retry resumes from
a checkpoint of the same run and meets it again; nor is an OOM (a retry resumes with the same model, batch
and memory, and runs out again at the same step: its verdict says what to change instead); everything else that can pass (a hang, a lost node, the
store) is retried.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from ..formats import exit_codes
from .backends.base import TERMINAL, JobState
from .choices import Choice
from ..health.verdict import DIVERGED, HEALTHY, NONFINITE, OOM, Verdict
from ..formats.run_result import RunResult
from . import remediation



class Action(Choice):
    """What becomes of an attempt: WATCH, nothing decided yet (the job runs on)."""

    SUCCEED = "succeed"
    RETRY = "retry"
    FAIL = "fail"
    WATCH = "watch"


# A retry resumes from a checkpoint of the same run and meets the same NaN or divergence: a person must
# change the config. An OOM too: the same model, per-worker batch and memory run out at the same step
# again (a data-parallel rank's memory does not depend on its luck), so retrying it as-is only spends the
# retries; the OOM verdict's advice says what to change (health/oom_advice.py).
NOT_RETRYABLE = (NONFINITE, DIVERGED, OOM)
# Verdicts seen from outside the job that explain its end when it wrote no result (a rank OOM-killed; a rank's
# OOM, or a script's NaN loss on a rank other than 0, while rank 0 died with the job in the collective that
# rank left: health/verdict_line.py): the job exits with the verdict's code, not the launcher's 1.
EXPLAINS_END = (OOM, NONFINITE)
# The job's state when nothing could be asked of its backend (watching it failed).
UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class Observation:
    """What is known of one attempt when its outcome is decided. Plain JSON both ways (the trigger's event).

    state: the backend's JobStatus.state, or UNKNOWN. exit_code/reason: what the backend (or the launcher's
    process) reported. result: the run folder's RunResult (one of another attempt counts as none). attempt:
    the attempt watched (worker_env.ATTEMPT_ENV), None when not known. verdict/fatal: the health verdict the
    watch saw, and whether it is fatal for this job (health.stop_on_degraded). waited: a fatal verdict was
    already seen one poll ago (the job was given that poll to stop itself). timed_out: the job ran past the
    task's timeout. refused: why the task refused the job before launching it. watch_error: why watching it
    failed.
    """

    state: JobState | str
    exit_code: int | None = None
    reason: str = ""
    result: RunResult | None = None
    attempt: str | None = None
    verdict: Verdict | None = None
    fatal: bool = False
    waited: bool = False
    timed_out: bool = False
    refused: str | None = None
    watch_error: str | None = None
    # The job has been replaying its failed step for longer than observe.replay_limit_seconds allows (a rank 0
    # frozen mid-replay would otherwise be watched until the task's timeout, or for ever without one).
    replay_overdue: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", _state(self.state))
        if self.result is not None and not isinstance(self.result, RunResult):
            raise ValueError(f"result is a {type(self.result).__name__}; use a RunResult (RunResult.from_json)")
        if self.verdict is not None and not isinstance(self.verdict, Verdict):
            raise ValueError(f"verdict is a {type(self.verdict).__name__}; use a health Verdict")

    @property
    def own_result(self) -> RunResult | None:
        """The result, if this attempt wrote it: an earlier attempt's in the same run folder is not this job's."""
        return self.result if self.result is not None and self.result.is_of(self.attempt) else None

    def to_dict(self) -> dict[str, Any]:
        verdict = None if self.verdict is None else self.verdict.to_dict() | {"fatal": self.fatal}
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)} | {"verdict": verdict}
        doc["result"] = self.result.to_json().decode() if self.result is not None else None
        del doc["fatal"]  # carried in the verdict, as the health watch reports it
        return json.loads(json.dumps(doc, default=str))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "Observation":
        v = doc.get("verdict") or None
        verdict = Verdict.from_dict(v)
        result = RunResult.from_json(doc["result"], "the watched job's result") if doc.get("result") else None
        return cls(state=doc.get("state") or UNKNOWN, exit_code=doc.get("exit_code"), reason=doc.get("reason") or "",
                   result=result, attempt=doc.get("attempt"), verdict=verdict, fatal=bool(v and v.get("fatal")),
                   waited=bool(doc.get("waited")), timed_out=bool(doc.get("timed_out")), refused=doc.get("refused"),
                   watch_error=doc.get("watch_error"), replay_overdue=bool(doc.get("replay_overdue")))


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the task does with the attempt (`action`), whether the job must be stopped first (`stop_job`),
    and why (`reason`, a sentence a person can act on). exit_code: the job's exit status as its own result
    says it (the launcher exits with it; None when it has none yet). state: the job's state with its result
    (a job whose result says failed has failed, whatever its pods said). verdict: the verdict that decided
    (the result's own, else the one watched), None if none did. stopped_itself: the job ended on its own
    verdict and is only tearing down."""

    action: Action
    reason: str
    exit_code: int | None = None
    stop_job: bool = False
    state: JobState | str = UNKNOWN
    verdict: Verdict | None = None
    stopped_itself: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", Action.of(self.action, "decision"))
        object.__setattr__(self, "state", _state(self.state))

    @property
    def decided(self) -> bool:
        """Whether there is an outcome (WATCH: the job runs on, nothing to decide yet)."""
        return self.action != Action.WATCH


def _state(value: Any) -> JobState | str:
    """A job state as its JobState, or UNKNOWN."""
    if value == UNKNOWN:
        return UNKNOWN
    if value not in tuple(JobState):
        raise ValueError(f"job state {value!r}: use one of {(*(s.value for s in JobState), UNKNOWN)}")
    return JobState(value)


def _failure(verdict: Verdict | None) -> Action:
    return Action.FAIL if verdict is not None and verdict.status in NOT_RETRYABLE else Action.RETRY


def _words(verdict: Verdict) -> str:
    return f"health verdict {verdict.status}: {verdict.reason}"


def decide(seen: Observation) -> Decision:
    """The one failure policy. Pure: the same Observation always gives the same Decision."""
    if seen.refused is not None:
        # Nothing was launched, and a retry would meet the same config: fail now and say what to fix.
        return Decision(Action.FAIL, seen.refused, exit_codes.CONFIG, state=JobState.FAILED)
    if seen.watch_error is not None:
        # The job may still be running: a retry reattaches to it (Backend.find) and watches again.
        return Decision(Action.RETRY, seen.watch_error, seen.exit_code, state=seen.state)
    result = seen.own_result
    if seen.state not in TERMINAL:
        return _running(seen, result)
    return _finished(seen, result)


def _running(seen: Observation, result: RunResult | None) -> Decision:
    verdict = seen.verdict if seen.fatal else None
    if result is not None and result.replaying and not seen.timed_out and not seen.replay_overdue:
        # Its verdict is written, and it replays the failed step to tell the data from a transient fault (at
        # most health.replay_seconds): its final result, with what the replay found, follows.
        own = result.verdict or verdict
        return Decision(Action.WATCH, f"{_words(own)}; replaying that step", state=seen.state, verdict=own)
    if verdict is not None and result is not None and not result.succeeded:
        # The job reached the verdict of its own records and wrote its failed result: only its teardown is left.
        own = result.verdict or verdict
        return Decision(_failure(own), f"stopped itself: {_words(own)}", result.exit_code, stop_job=True,
                        state=JobState.FAILED, verdict=own, stopped_itself=True)
    if verdict is not None and result is None:
        if not seen.waited:
            return Decision(Action.WATCH, f"{_words(verdict)}; one poll for the job to stop itself", state=seen.state,
                            verdict=verdict)
        return Decision(_failure(verdict), _words(verdict), None, stop_job=True, state=seen.state, verdict=verdict)
    # No fatal verdict, or one after the job recorded its success (its work is done: it exits on its own).
    if seen.timed_out:
        return Decision(Action.RETRY, "ran past its timeout", None, stop_job=True, state=seen.state,
                        verdict=seen.verdict)
    return Decision(Action.WATCH, seen.reason or "running", state=seen.state, verdict=seen.verdict)


def _finished(seen: Observation, result: RunResult | None) -> Decision:
    if result is None:
        verdict = seen.verdict
        if seen.state == JobState.SUCCEEDED:
            who = f"attempt {seen.attempt}" if seen.attempt else "this attempt"
            return Decision(Action.RETRY, f"it ended as succeeded but wrote no result.json for {who}: check the "
                                          "job's log", seen.exit_code, state=JobState.SUCCEEDED, verdict=verdict)
        said = seen.reason or exit_codes.meaning(seen.exit_code)
        if verdict is not None and verdict.status != HEALTHY:
            said += f" — {_words(verdict)}"
        code = exit_codes.for_verdict(verdict.status) if verdict is not None and verdict.status in EXPLAINS_END \
            else seen.exit_code
        return Decision(_failure(verdict), said, code, state=JobState.FAILED, verdict=verdict)
    verdict = result.verdict or seen.verdict
    if result.succeeded and seen.state == JobState.SUCCEEDED:
        return Decision(Action.SUCCEED, seen.reason, exit_codes.OK, state=JobState.SUCCEEDED, verdict=verdict)
    if result.succeeded:
        # The job finished its work, then something around it failed: still a failure, which a retry may pass.
        said = seen.reason or exit_codes.meaning(seen.exit_code)
        return Decision(Action.RETRY, said, seen.exit_code, state=JobState.FAILED, verdict=verdict)
    # The job's own failure: its result says which, whatever the process layers made of it.
    said = _words(result.verdict) if result.verdict else seen.reason or exit_codes.meaning(result.exit_code)
    return Decision(_failure(verdict), said, result.exit_code, state=JobState.FAILED, verdict=verdict)


def remediated(decision: Decision, remedy: remediation.Remedy) -> Decision:
    """The decision once the remediation policy (`remediation: "auto"`, remediation.py) has answered its
    verdict: a failure it can change is retried with the change, even one the policy alone fails (a NaN, an
    OOM: the next try is no longer the same job); one it has no remedy left for fails without retry, since the
    next try would meet it again; AS_IS leaves the decision as it was. Success and watching are not its to
    change. Pure, as `decide`."""
    if decision.action not in (Action.RETRY, Action.FAIL) or decision.verdict is None:
        return decision
    if remedy.action == remediation.RemedyAction.CHANGE:
        return dataclasses.replace(decision, action=Action.RETRY,
                                   reason=f"{decision.reason}; the next try: {remedy.words}")
    if remedy.action == remediation.RemedyAction.GIVE_UP:
        return dataclasses.replace(decision, action=Action.FAIL,
                                   reason=f"{decision.reason}; no remedy left: {remedy.words}")
    return decision
