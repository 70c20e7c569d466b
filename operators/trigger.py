"""Watches a training job from the triggerer: job status, its log, and its gradient-sync health.

Yields exactly one event and never raises (Airflow provider convention):
    {"status": "success" | "error" | "timeout", "job_id", "state", "reason", "exit_code", "verdict", "message",
     "result": the job's RunResult as JSON (RunResult.from_json) or None, "stopped_by": "job" | "trigger"}
Once the job has finished, its own result (run_result.py, this attempt's only) decides: exit code, verdict,
success. While it runs, a fatal health verdict stops the job here, without waiting for the job to notice
itself; `stopped_by` says whether the job had already stopped on its own verdict (it wrote a failed result)
or the trigger stopped it (its verdict, a stall seen on the heartbeat, or the timeout). Only the watched
attempt's records count, and a stall is judged on rank 0's heartbeat (training/core/runs/health_watch.py), never on the
gaps between health records. Each poll reads only what is new, so its cost stays flat as the run grows.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ringflow.operators.connections import AirflowConnections, open_store_for
from ringflow.training.core.backends.base import JobStatus, backend_from_dict, with_result
from ringflow.training.formats.run_result import RunResult


WAIT, STOP, STOPPED_ITSELF, LET_FINISH = "wait", "stop", "stopped_itself", "let_finish"


def on_fatal_verdict(result: RunResult | None, waited: bool) -> str:
    """What the trigger does about a fatal verdict on a job still running, given this attempt's result. Pure.

    The job reaches the verdicts of its own records itself and stops after writing a failed result; it is
    given one poll for that (WAIT), so a job that stopped itself is not reported as stopped by the trigger.
    """
    if result is not None and result.succeeded:
        return LET_FINISH  # its work is done and recorded: it exits on its own
    if result is not None:
        return STOPPED_ITSELF
    return STOP if waited else WAIT


class HorovodJobTrigger(BaseTrigger):
    def __init__(self, backend_kind: str, backend_kwargs: dict[str, Any], job_id: str, run_uri: str,
                 health: dict[str, Any] | None = None, conn_id: str | None = None, poll_interval: float = 2.0,
                 timeout_at: float | None = None, log_cursor: Any = None, attempt: str | None = None):
        super().__init__()
        self.backend_kind, self.backend_kwargs = backend_kind, backend_kwargs
        self.job_id, self.run_uri, self.health = job_id, run_uri, health or {}
        self.conn_id, self.poll_interval, self.timeout_at = conn_id, poll_interval, timeout_at
        self.log_cursor = log_cursor
        # The job's attempt id (worker_env.ATTEMPT_ENV) when the launcher knows it; else learnt from its log.
        self.attempt = attempt

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "backend_kind": self.backend_kind, "backend_kwargs": self.backend_kwargs, "job_id": self.job_id,
            "run_uri": self.run_uri, "health": self.health, "conn_id": self.conn_id,
            "poll_interval": self.poll_interval, "timeout_at": self.timeout_at, "log_cursor": self.log_cursor,
            "attempt": self.attempt,
        })

    def _backend(self):
        return backend_from_dict(self.backend_kind, self.backend_kwargs, AirflowConnections())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            event = await self._watch()
        except Exception as exc:  # noqa: BLE001 - a trigger reports, it does not raise
            event = {"status": "error", "job_id": self.job_id, "state": "unknown", "reason": repr(exc),
                     "exit_code": None, "verdict": None, "message": f"watching job {self.job_id} failed: {exc!r}",
                     "result": None, "stopped_by": None}
        yield TriggerEvent(event)

    async def _watch(self) -> dict[str, Any]:
        from ringflow.training.core.runs.health_watch import HealthWatch

        backend = self._backend()
        # Rebuilt from the serialized fields alone (a restarted triggerer): its first poll reads the run once.
        run = await asyncio.to_thread(open_store_for, self.run_uri, self.conn_id)  # a connection lookup blocks
        watch = HealthWatch(run, self.health, self.attempt)
        running_since, grace_used = None, False
        while True:
            status = await backend.astatus(self.job_id)
            if status.state == "running" and running_since is None:
                running_since = time.time()
            watch.learn_from_log(await self._stream_logs(backend))
            if status.finished:
                watch.learn_from_log(await self._stream_logs(backend))
            now = time.time() if running_since is not None and not status.finished else None
            verdict = await asyncio.to_thread(watch.poll, now, running_since)
            if status.finished:
                status = with_result(status, await asyncio.to_thread(self._result, run, watch.attempt))
                return self._finished(status, verdict, watch)
            action = None
            if verdict and verdict.get("fatal"):
                result = await asyncio.to_thread(self._result, run, watch.attempt)
                action = on_fatal_verdict(result, grace_used)
            if action == WAIT:
                grace_used = True
                await asyncio.sleep(self.poll_interval)
                continue
            if action == STOPPED_ITSELF:
                await backend.adelete(self.job_id)  # it is on its way out: only its teardown is left
                status = with_result(dataclasses.replace(status, state="failed"), result)
                return self._event("error", status, _verdict_of(result, watch, verdict),
                                   f"job {self.job_id} stopped itself: {status.reason}", "job")
            if action == STOP:
                self.log.error("health verdict %s: %s; stopping job %s", verdict["status"], verdict["reason"],
                               self.job_id)
                await backend.adelete(self.job_id)
                return self._event("error", status, verdict,
                                   f"stopped job {self.job_id}: health verdict {verdict['status']}: {verdict['reason']}",
                                   "trigger")
            if self.timeout_at is not None and time.time() > self.timeout_at:
                await backend.adelete(self.job_id)
                return self._event("timeout", status, verdict,
                                   f"job {self.job_id} ran past its timeout and was stopped", "trigger")
            await asyncio.sleep(self.poll_interval)

    @staticmethod
    def _result(run, attempt: str | None):
        """This attempt's RunResult, or None (not written yet, or the attempt is not known: then a result
        in the run folder may be an earlier attempt's, which is not this job's)."""
        if attempt is None:
            return None
        from ringflow.training.formats.run_result import read_result

        return read_result(run, attempt)

    def _finished(self, status: JobStatus, verdict: dict | None, watch) -> dict[str, Any]:
        result = status.result
        if result is not None:
            verdict = _verdict_of(result, watch, verdict)
        ok = status.state == "succeeded" and (result is None or result.succeeded)
        if ok:
            message = f"job {self.job_id} succeeded"
        elif result is not None and result.verdict is not None:
            message = f"job {self.job_id} failed: {status.reason}"
        else:
            message = (f"job {self.job_id} failed: {status.reason}" +
                       (f" — health verdict {verdict['status']}: {verdict['reason']}"
                        if verdict and verdict["status"] != "HEALTHY" else ""))
        return self._event("success" if ok else "error", status, verdict, message, "job")

    async def _stream_logs(self, backend) -> list[str]:
        chunk = await backend.alogs(self.job_id, self.log_cursor)
        for line in chunk.lines:
            self.log.info("%s", line)
        self.log_cursor = chunk.next_cursor
        return chunk.lines

    def _event(self, kind: str, status: JobStatus, verdict, message: str, stopped_by: str) -> dict[str, Any]:
        result = status.result
        return {"status": kind, "job_id": self.job_id, "state": status.state, "reason": status.reason,
                "exit_code": status.exit_code, "verdict": verdict, "message": message,
                "result": result.to_json().decode() if result is not None else None, "stopped_by": stopped_by}

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: stop the job it was watching."""
        await self._backend().adelete(self.job_id)


def _verdict_of(result, watch, seen: dict | None) -> dict | None:
    """The job's own final verdict (its result) in the event's shape; what the watch saw when it has none."""
    if result.verdict is None:
        return seen
    return result.verdict.to_dict() | {"fatal": result.verdict.is_fatal(watch.cfg.stop_on_degraded),
                                       "attempt": result.attempt}
