"""One interface for running a training job, on this machine or on a cluster (after Kubeflow SDK's Backend).

The operator calls the sync methods; the trigger calls the async ones from the triggerer's event loop.
A backend must be rebuilt from `to_dict()` alone: the trigger carries it as plain JSON.
"""
from __future__ import annotations

import abc
import asyncio
import dataclasses
from typing import Any, ClassVar, Sequence

from ...formats import exit_codes
from .connections import Connections
from .job_spec import JobSpec
from ...formats.engines import LOCAL, MPIJOB, TRAINJOB
from ...health.verdict import Verdict
from ..choices import Choice


class JobState(Choice):
    """What a backend sees of a job (JobStatus.state)."""

    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED})


class JobNotFound(LookupError):
    """The backend has no job with this id (never launched, or already deleted)."""


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """What the backend sees of a job.

    A backend sees processes or pods: their state and an exit status, which the process layers in between
    may have collapsed (mpirun and horovodrun turn any rank's failure into 1). The job's own outcome is its
    RunResult, which whoever decides (the launcher, the trigger, the operator) reads from the run folder and
    gives the failure policy (core/failure_policy.py) beside this status.
    """

    state: JobState
    reason: str = ""
    exit_code: int | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    # What the backend itself saw end the job, as a health verdict: a pod Kubernetes OOMKilled (OOM).
    verdict: Verdict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", JobState.of(self.state, "job state"))
        if self.verdict is not None and not isinstance(self.verdict, Verdict):
            raise ValueError(f"job verdict is a {type(self.verdict).__name__}; use a health Verdict")

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL


def exit_reason(code: int | None) -> str:
    """A backend's words for a job's exit status (the one table: ringflow.training.formats.exit_codes)."""
    return exit_codes.meaning(code)


@dataclasses.dataclass(frozen=True)
class LogChunk:
    """New log lines since `cursor`; pass `next_cursor` back to get the lines after these."""

    lines: list[str]
    next_cursor: Any


class Backend(abc.ABC):
    kind: ClassVar[str]
    connections: Connections | None = None  # resolves the backend's conn_id (backends/connections.py)

    @abc.abstractmethod
    def launch(self, spec: JobSpec) -> str:
        """Start the job; return its id. Must not block until the job ends."""

    def capacity(self, num_workers: int, avoid_nodes: Sequence[str] = ()) -> int:
        """How many of `num_workers` workers it can place now, kept off `avoid_nodes` (the operator's
        min_workers compares). Default: all of them (the local backend runs its workers as processes on this
        machine, and has no nodes to avoid)."""
        return num_workers

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


# The class of each backend kind ("module:class", imported when asked for), the kind named for what it creates
# (formats/engines.py names the kinds, with the engines each can run).
_BACKEND_CLASSES: dict[str, str] = {
    LOCAL: "ringflow.training.core.backends.local:LocalProcessBackend",
    MPIJOB: "ringflow.training.core.backends.kubernetes.mpijob_backend:MPIJobBackend",
    TRAINJOB: "ringflow.training.core.backends.kubernetes.trainjob_backend:TrainJobBackend",
}


def backend_from_dict(kind: str, kwargs: dict[str, Any], connections: Connections | None = None) -> Backend:
    """Rebuild a backend from its kind and `to_dict()` (what a trigger serializes), with the `connections`
    that resolve its connection id (not serialized: a lookup, not data)."""
    import importlib

    try:
        module_name, class_name = _BACKEND_CLASSES[kind].split(":")
    except KeyError:
        raise ValueError(f"unknown backend kind {kind!r}; use one of {sorted(_BACKEND_CLASSES)}") from None
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**kwargs, connections=connections)
