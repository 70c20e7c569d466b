"""A rank's side of an OOM, for every engine: the evidence of an out-of-memory exception it caught, read before
it dies, and how the rank then ends (its verdict in the log, on rank 0 also in its records and result).

The classification, the verdict and its advice are health/oom.py's; nothing here imports torch or TensorFlow,
so the torch and the TensorFlow ranks end an OOM the same way (rank_run.run_rank). The device memory is the
engine's to say (`device_memory`: torch's CUDA allocator; None on CPUs).
"""
from __future__ import annotations

import sys
from typing import Callable

from ..formats import exit_codes
from ..formats.config import JobConfig
from ..formats.run_result import FAILED
from ..health.memory_limits import MemoryLimits
from ..health.oom import MemoryEvidence, oom_verdict, requested_bytes
from ..health.oom_advice import JobShape
from ..health.records import record
from ..health.verdict_line import verdict_line
from .rank_start import LAST_WORD_SECONDS, RankStart, write_failed_result, within


def oom_evidence(exc: BaseException, kind: str, rank: int, step: int | None,
                 device_bytes: int | None = None) -> MemoryEvidence:
    """What this rank had when `exc` (an OOM of `kind`, health.oom.classify) was raised at `step`."""
    memory = MemoryLimits.read(rank)
    limit = memory.limit
    message = str(exc)
    return MemoryEvidence(kind, rank, step, seen_by=f"rank {rank} itself",
                          limit_bytes=limit[0] if limit else None, limit_source=limit[1] if limit else None,
                          peak_rss_bytes=memory.peak_rss_bytes, device_bytes=device_bytes,
                          requested_bytes=requested_bytes(message), message=message.splitlines()[0][:300] if message
                          else type(exc).__name__)


def end_on_oom(exc: BaseException, kind: str, cfg: JobConfig, engine, trainer, start: RankStart | None,
               device_memory: Callable[[object], int | None] | None = None) -> int:
    """This rank ran out of memory: its verdict in the log (every rank: a rank other than 0 writes nothing
    else anyone reads), and on rank 0 in its health records and result; then the job ends with its code.
    `trainer`: the engine's RankRun once it exists (None before)."""
    step = trainer.training_step() if trainer is not None else None
    evidence = oom_evidence(exc, kind, engine.rank, step, device_memory(engine) if device_memory else None)
    verdict = oom_verdict(evidence, JobShape.of(cfg, engine.size, engine.name))  # the engine that ran
    print(f"[ringflow] rank {engine.rank}: health verdict OOM: {verdict.reason}", file=sys.stderr, flush=True)
    print(verdict_line(verdict), file=sys.stderr, flush=True)
    if trainer is not None and getattr(trainer, "guard", None) is not None \
            and getattr(trainer, "health_log", None) is not None:
        trainer.guard.check()
        trainer.health_log.append(record("oom", reason=verdict.reason, evidence=dict(verdict.evidence)))
        within(LAST_WORD_SECONDS, lambda: (trainer.health_log.close(), trainer.guard.publish_result(
            trainer.result(FAILED, verdict, None).to_json())))
    elif start is not None:
        write_failed_result(start, engine.size, verdict)
    if trainer is not None and getattr(trainer, "liveness", None) is not None:
        trainer.liveness.stop()
    return exit_codes.for_verdict(verdict.status)
