"""A torch rank's side of an OOM: the evidence of an out-of-memory exception it caught, read before it dies.

The classification, the verdict and its advice are torch-free (health/oom.py), for a TensorFlow rank too;
only the device memory is torch's.
"""
from __future__ import annotations

import torch

from ..health.memory_limits import MemoryLimits
from ..health.oom import MemoryEvidence, requested_bytes


def oom_evidence(exc: BaseException, kind: str, rank: int, step: int | None, cuda: bool) -> MemoryEvidence:
    """What this rank had when `exc` (an OOM of `kind`, health.oom.classify) was raised at `step`."""
    memory = MemoryLimits.read(rank)
    limit = memory.limit
    device = None
    if cuda and torch.cuda.is_available():
        device = torch.cuda.max_memory_allocated()
    message = str(exc)
    return MemoryEvidence(kind, rank, step, seen_by=f"rank {rank} itself",
                          limit_bytes=limit[0] if limit else None, limit_source=limit[1] if limit else None,
                          peak_rss_bytes=memory.peak_rss_bytes, device_bytes=device,
                          requested_bytes=requested_bytes(message), message=message.splitlines()[0][:300] if message
                          else type(exc).__name__)
