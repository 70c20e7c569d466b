"""One interface for running a training job, on this machine or on a cluster (after Kubeflow SDK's Backend).

The operator calls the sync methods; the trigger calls the async ones from the triggerer's event loop.
A backend must be rebuilt from `to_dict()` alone: the trigger carries it as plain JSON.
"""
from __future__ import annotations

import abc
import asyncio
import dataclasses
from typing import Any, ClassVar

from ringflow.operators.job_spec import JobSpec

PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED = "pending", "running", "restarting", "succeeded", "failed"
STATES = (PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED)
TERMINAL = (SUCCEEDED, FAILED)


class JobNotFound(LookupError):
    """The backend has no job with this id (never launched, or already deleted)."""


@dataclasses.dataclass(frozen=True)
class JobStatus:
    state: str
    reason: str = ""
    exit_code: int | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"job state {self.state!r} is not one of {STATES}")

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL


@dataclasses.dataclass(frozen=True)
class LogChunk:
    """New log lines since `cursor`; pass `next_cursor` back to get the lines after these."""

    lines: list[str]
    next_cursor: Any


class Backend(abc.ABC):
    kind: ClassVar[str]

    @abc.abstractmethod
    def launch(self, spec: JobSpec) -> str:
        """Start the job; return its id. Must not block until the job ends."""

    @abc.abstractmethod
    def find(self, labels: dict[str, str]) -> str | None:
        """The id of a live (unfinished) job carrying all these labels, for reattaching on retry."""

    @abc.abstractmethod
    def status(self, job_id: str) -> JobStatus:
        """Raises JobNotFound."""

    @abc.abstractmethod
    def logs(self, job_id: str, cursor: Any = None) -> LogChunk: ...

    @abc.abstractmethod
    def delete(self, job_id: str) -> None:
        """Stop the job and remove what it made. A job already gone is not an error."""

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON constructor arguments: `type(self)(**to_dict())` rebuilds this backend."""

    async def astatus(self, job_id: str) -> JobStatus:
        return await asyncio.to_thread(self.status, job_id)

    async def alogs(self, job_id: str, cursor: Any = None) -> LogChunk:
        return await asyncio.to_thread(self.logs, job_id, cursor)

    async def adelete(self, job_id: str) -> None:
        await asyncio.to_thread(self.delete, job_id)


_REGISTRY: dict[str, str] = {
    "local": "ringflow.operators.backends.local:LocalProcessBackend",
    "kubernetes": "ringflow.operators.kubernetes.backend:MPIJobBackend",
}


def backend_from_dict(kind: str, kwargs: dict[str, Any]) -> Backend:
    """Rebuild a backend from its kind and `to_dict()` (what a trigger serializes)."""
    import importlib

    try:
        module_name, class_name = _REGISTRY[kind].split(":")
    except KeyError:
        raise ValueError(f"unknown backend kind {kind!r}; use one of {sorted(_REGISTRY)}") from None
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**kwargs)
