"""Watches a training job from the triggerer: job status, its log, and its gradient-sync health.

Yields exactly one event and never raises (Airflow provider convention):
    {"status": "success" | "error" | "timeout", "job_id", "state", "reason", "exit_code", "verdict", "message"}
A fatal health verdict stops the job here, without waiting for the job to notice itself.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ringflow.operators.backends.base import backend_from_dict


class HorovodJobTrigger(BaseTrigger):
    def __init__(self, backend_kind: str, backend_kwargs: dict[str, Any], job_id: str, run_uri: str,
                 health: dict[str, Any] | None = None, conn_id: str | None = None, poll_interval: float = 2.0,
                 timeout_at: float | None = None, log_cursor: Any = None):
        super().__init__()
        self.backend_kind, self.backend_kwargs = backend_kind, backend_kwargs
        self.job_id, self.run_uri, self.health = job_id, run_uri, health or {}
        self.conn_id, self.poll_interval, self.timeout_at = conn_id, poll_interval, timeout_at
        self.log_cursor = log_cursor

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "backend_kind": self.backend_kind, "backend_kwargs": self.backend_kwargs, "job_id": self.job_id,
            "run_uri": self.run_uri, "health": self.health, "conn_id": self.conn_id,
            "poll_interval": self.poll_interval, "timeout_at": self.timeout_at, "log_cursor": self.log_cursor,
        })

    def _backend(self):
        return backend_from_dict(self.backend_kind, self.backend_kwargs)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            event = await self._watch()
        except Exception as exc:  # noqa: BLE001 - a trigger reports, it does not raise
            event = {"status": "error", "job_id": self.job_id, "state": "unknown", "reason": repr(exc),
                     "exit_code": None, "verdict": None, "message": f"watching job {self.job_id} failed: {exc!r}"}
        yield TriggerEvent(event)

    async def _watch(self) -> dict[str, Any]:
        from ringflow.operators.run_health import read_verdict

        backend = self._backend()
        running_since = None
        while True:
            status = await backend.astatus(self.job_id)
            if status.state == "running" and running_since is None:
                running_since = time.time()
            await self._stream_logs(backend)
            now = time.time() if running_since is not None and not status.finished else None
            verdict = await asyncio.to_thread(read_verdict, self.run_uri, self.health, self.conn_id, now,
                                              running_since)
            if status.finished:
                await self._stream_logs(backend)
                ok = status.state == "succeeded"
                message = (f"job {self.job_id} succeeded" if ok else
                           f"job {self.job_id} failed: {status.reason}" +
                           (f" — health verdict {verdict['status']}: {verdict['reason']}"
                            if verdict and verdict["status"] != "HEALTHY" else ""))
                return self._event("success" if ok else "error", status, verdict, message)
            if verdict and verdict.get("fatal"):
                self.log.error("health verdict %s: %s; stopping job %s", verdict["status"], verdict["reason"], self.job_id)
                await backend.adelete(self.job_id)
                return self._event("error", status, verdict,
                                   f"stopped job {self.job_id}: health verdict {verdict['status']}: {verdict['reason']}")
            if self.timeout_at is not None and time.time() > self.timeout_at:
                await backend.adelete(self.job_id)
                return self._event("timeout", status, verdict, f"job {self.job_id} ran past its timeout and was stopped")
            await asyncio.sleep(self.poll_interval)

    async def _stream_logs(self, backend) -> None:
        chunk = await backend.alogs(self.job_id, self.log_cursor)
        for line in chunk.lines:
            self.log.info("%s", line)
        self.log_cursor = chunk.next_cursor

    def _event(self, kind: str, status, verdict, message: str) -> dict[str, Any]:
        return {"status": kind, "job_id": self.job_id, "state": status.state, "reason": status.reason,
                "exit_code": status.exit_code, "verdict": verdict, "message": message}

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: stop the job it was watching."""
        await self._backend().adelete(self.job_id)
