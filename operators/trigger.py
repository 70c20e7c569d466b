"""Watches a training job from the triggerer: job status, its log, and its gradient-sync health.

It only watches and reports: one event, plain JSON, and it never raises and never stops the job (Airflow
provider convention). It polls until the failure policy (training/core/failure_policy.py) has something to
decide, then reports what it saw, the policy's Observation (what a poll counts as: training/core/observe.py):
    Observation.to_dict() | {"status": "success" | "error" | "timeout", "job_id", "message"}
(`state`, `exit_code`, `reason` as the backend said them; `result`: this attempt's RunResult as JSON or None;
`verdict`: the watched health verdict with `fatal`; `waited`, `timed_out`, `watch_error`). The operator's
execute_complete decides on it through the same policy (and the next try, training/core/attempts.py), and
stops the job when the decision says so.

Once the job has finished, its own result (run_result.py, this attempt's only) decides. While it runs, a
fatal health verdict is reported without waiting for the job to notice itself, after one poll in which the
job may stop itself (it writes a failed result). Only the watched attempt's records count, and a stall is
judged on rank 0's heartbeat (training/core/runs/health_watch.py), never on the gaps between health records.
Each poll reads only what is new, so its cost stays flat as the run grows.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ringflow.operators.connections import AirflowConnections, open_store_for
from ringflow.training.core.backends.base import JobState, backend_from_dict
from ringflow.training.core.failure_policy import UNKNOWN, Action, Observation, decide
from ringflow.training.core.observe import Poll, Watching, observe, wants_result


class TrainJobTrigger(BaseTrigger):
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
            seen = Observation(UNKNOWN, attempt=self.attempt, watch_error=f"watching job {self.job_id} failed: {exc!r}")
            event = self.event(self.job_id, seen)
        yield TriggerEvent(event)

    async def _watch(self) -> dict[str, Any]:
        from ringflow.training.core.runs.health_watch import HealthWatch

        backend = self._backend()
        # Rebuilt from the serialized fields alone (a restarted triggerer): its first poll reads the run once.
        run = await asyncio.to_thread(open_store_for, self.run_uri, self.conn_id)  # a connection lookup blocks
        watch = HealthWatch(run, self.health, self.attempt)
        running_since, carried = None, Watching()
        while True:
            status = await backend.astatus(self.job_id)
            if status.state == JobState.RUNNING and running_since is None:
                running_since = time.time()
            watch.learn_from_log(await self._stream_logs(backend))
            if status.finished:
                watch.learn_from_log(await self._stream_logs(backend))
            now = time.time() if running_since is not None and not status.finished else None
            watched = await asyncio.to_thread(watch.poll, now, running_since)
            result = await asyncio.to_thread(self._result, run, watch.attempt) if wants_result(status, watched) \
                else None
            seen, carried = observe(Poll(status, watched, watch.last_step, result, watch.attempt, time.time()),
                                    carried, timeout_at=self.timeout_at, health=self.health)
            if decide(seen).decided:
                if seen.verdict is not None and seen.fatal:
                    self.log.error("health verdict %s: %s (job %s)", seen.verdict.status, seen.verdict.reason,
                                   self.job_id)
                return self.event(self.job_id, seen)
            await asyncio.sleep(self.poll_interval)

    @staticmethod
    def event(job_id: str, seen: Observation) -> dict[str, Any]:
        """The one event: what was seen (the policy's Observation), and its words for the log."""
        decision = decide(seen)
        if decision.action == Action.SUCCEED:
            kind, message = "success", f"job {job_id} succeeded"
        else:
            kind = "timeout" if seen.timed_out and decision.stop_job and not decision.stopped_itself else "error"
            message = f"job {job_id}: {decision.reason}"
        return seen.to_dict() | {"status": kind, "job_id": job_id, "message": message}

    @staticmethod
    def _result(run, attempt: str | None):
        """This attempt's RunResult, or None (not written yet, or the attempt is not known: then a result
        in the run folder may be an earlier attempt's, which is not this job's)."""
        if attempt is None:
            return None
        from ringflow.training.formats.run_folder import RunFolder

        return RunFolder(run).read_result(attempt)

    async def _stream_logs(self, backend) -> list[str]:
        chunk = await backend.alogs(self.job_id, self.log_cursor)
        for line in chunk.lines:
            self.log.info("%s", line)
        self.log_cursor = chunk.next_cursor
        return chunk.lines

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: stop the job it was watching. Not a
        decision on the job's outcome (those are the operator's): the task is gone, and nobody else would."""
        await self._backend().adelete(self.job_id)

