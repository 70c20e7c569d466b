"""Out of memory: the one OOM verdict, whoever saw it, with its evidence and what to change.

    rank raises it (rank_run.py)      torch OOM, TensorFlow ResourceExhaustedError, MemoryError
    the launcher sees it (oom_watch)  the kernel's OOM killer SIGKILLed a local rank in its memory cgroup
    the cluster says it (mpijob_outcome.py)  a pod's container terminated with reason OOMKilled

Each becomes `oom_verdict(MemoryEvidence, JobShape)`: verdict OOM, naming the rank, the step, the memory it
had and the advice (oom_advice.py). Torch-free and TensorFlow-free: an exception is classified by its type's
NAME (`classify`), so a TensorFlow rank calls the same functions without this module importing TF.

A rank other than 0 writes nothing to the run folder (rank 0 holds the fence), so the verdict travels as
one line of the job's log (verdict_line.py), which the launcher and the trigger read anyway, on every backend.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from .oom_advice import JobShape, advise
from .verdict import OOM, Verdict

TORCH_OOM = "torch_oom"
TF_RESOURCE_EXHAUSTED = "tf_resource_exhausted"
MEMORY_ERROR = "memory_error"
KERNEL_OOM_KILLER = "kernel_oom_killer"
KUBERNETES_OOMKILLED = "kubernetes_oomkilled"
KINDS = (TORCH_OOM, TF_RESOURCE_EXHAUSTED, MEMORY_ERROR, KERNEL_OOM_KILLER, KUBERNETES_OOMKILLED)
WORDS = {TORCH_OOM: "torch could not allocate memory", TF_RESOURCE_EXHAUSTED: "TensorFlow's ResourceExhaustedError",
         MEMORY_ERROR: "Python's MemoryError", KERNEL_OOM_KILLER: "the kernel's OOM killer SIGKILLed it",
         KUBERNETES_OOMKILLED: "its container was OOMKilled"}

# By type name, anywhere in the exception's class hierarchy: torch.OutOfMemoryError (CUDA, and CPU where
# torch raises it), tensorflow.errors.ResourceExhaustedError, Python's MemoryError.
_BY_TYPE = {"OutOfMemoryError": TORCH_OOM, "ResourceExhaustedError": TF_RESOURCE_EXHAUSTED,
            "MemoryError": MEMORY_ERROR}
# What torch's allocators say when they raise a plain RuntimeError: the CPU allocator ("DefaultCPUAllocator:
# can't allocate memory", torch 2.x on CPU) and older CUDA ones ("CUDA out of memory").
_TORCH_MESSAGE = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)|out of memory", re.I)
# "you tried to allocate 8589934592 bytes" (CPU), "Tried to allocate 2.00 GiB" (CUDA)
_REQUESTED = re.compile(r"tried to allocate ([0-9.]+) ?(bytes|[KMGT]iB|B)", re.I)
_UNITS = {"bytes": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

STEP_NOT_KNOWN = "at a step not known"


def classify(exc: BaseException) -> str | None:
    """The OOM kind `exc` is (TORCH_OOM, TF_RESOURCE_EXHAUSTED, MEMORY_ERROR), or None if it is no OOM.
    By type name, so neither torch nor TensorFlow is imported here."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _BY_TYPE:
            return _BY_TYPE[cls.__name__]
    if isinstance(exc, RuntimeError) and _TORCH_MESSAGE.search(str(exc)):
        return TORCH_OOM
    return None


def requested_bytes(message: str) -> int | None:
    """How much the failed allocation asked for, where the message says it."""
    match = _REQUESTED.search(message)
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()]) if match else None


@dataclasses.dataclass(frozen=True)
class MemoryEvidence:
    """What is known of one OOM. rank/step: None where not known (a pod hosting several ranks; no heartbeat
    yet). limit_bytes/limit_source: the memory it was given (a cgroup limit, RLIMIT_AS, a pod's limit).
    peak_rss_bytes: its resident set at its highest; device_bytes: accelerator memory allocated; requested_bytes:
    what the failed allocation asked for; seen_by: who saw it; message: the error's first words."""

    kind: str
    rank: int | None
    step: int | None
    seen_by: str
    limit_bytes: int | None = None
    limit_source: str | None = None
    peak_rss_bytes: int | None = None
    device_bytes: int | None = None
    requested_bytes: int | None = None
    message: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"OOM kind {self.kind!r}: use one of {KINDS}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "MemoryEvidence":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def _mib(n: int | None) -> str:
    return f"{n / 2**20:.0f} MiB"


def had(evidence: MemoryEvidence) -> str:
    """The memory the rank had, in words: whatever of it is known."""
    parts = []
    if evidence.limit_bytes is not None:
        parts.append(f"limit {_mib(evidence.limit_bytes)} ({evidence.limit_source or 'limit'})")
    if evidence.peak_rss_bytes is not None:
        parts.append(f"peak RSS {_mib(evidence.peak_rss_bytes)}")
    if evidence.device_bytes is not None:
        parts.append(f"device memory allocated {_mib(evidence.device_bytes)}")
    if evidence.requested_bytes is not None:
        parts.append(f"asked for {_mib(evidence.requested_bytes)} more")
    return ", ".join(parts) or "memory not known"


def oom_verdict(evidence: MemoryEvidence, shape: JobShape | None) -> Verdict:
    """The OOM verdict: who, when, what it had, and what to change (oom_advice.advise)."""
    advice = advise(shape, evidence.limit_bytes, evidence.limit_source)
    who = f"rank {evidence.rank}" if evidence.rank is not None else "a rank"
    when = f"at step {evidence.step}" if evidence.step is not None else STEP_NOT_KNOWN
    reason = (f"{who} ran out of memory {when}: {WORDS[evidence.kind]} ({had(evidence)}), seen by "
              f"{evidence.seen_by}. Change one of: " + "; or ".join(a.words for a in advice))
    return Verdict(OOM, reason, evidence.to_dict() | {"advice": [a.to_dict() for a in advice]})


def with_step(verdict: Verdict, step: int | None) -> Verdict:
    """An OOM verdict seen from outside without a step, with the step learnt elsewhere (rank 0's heartbeat)."""
    if verdict.status != OOM or verdict.evidence.get("step") is not None or step is None:
        return verdict
    return Verdict(OOM, verdict.reason.replace(STEP_NOT_KNOWN, f"at step {step}", 1),
                   dict(verdict.evidence) | {"step": step})
