"""What every rank sets up before anything can hang, whatever its engine, and its last words: the attempt's id,
the run folder, liveness, rank 0's claim of the run folder (fence_guard.py), and how a rank records a
liveness or store verdict. Torch-free: the torch ranks (worker.py) and the TensorFlow ranks
(tensorflow_worker.py) start and end the same way.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import uuid
from typing import Any

from ..formats import exit_codes
from ..formats.config import JobConfig
from ..formats.run_result import FAILED, RunResult
from ..health.progress import Progress
from ..health.records import record
from ..health.store_ops import StoreOp
from ..health.verdict import STALLED, Verdict, store_unavailable
from ..store import ObjectStore, open_store
from .callbacks.liveness import Liveness
from .fence_guard import FenceGuard
from .worker_env import ATTEMPT_ENV, launcher_rank, launcher_world_size


def store_call(progress: Progress, what: str, store: ObjectStore, call):
    """`call(moved)` on the training thread as a wait for the store: its time is the store's, not silence."""
    op = StoreOp(what, store.uri)
    with progress.waiting(op):
        try:
            result = call(op.moved)
        except BaseException as exc:
            op.finish(exc)
            raise
    op.finish()
    return result


@dataclasses.dataclass
class RankStart:
    """What a rank sets up before anything can hang: its attempt's id, the run folder, its liveness, and on
    rank 0 the claim that makes this attempt the run folder's current one (fence_guard.py)."""

    attempt: str
    run_store: ObjectStore
    liveness: Liveness
    guard: FenceGuard | None  # rank 0's: where it writes, and how it publishes
    # The attempt's health log on this process (rank_run.RankRun._open), and the claim it writes under: an
    # elastic job's process keeps it across changes of workers.
    health_log: Any = None
    health_log_guard: FenceGuard | None = None

    @classmethod
    def begin(cls, cfg: JobConfig, rank: int, on_stall, claim: bool = True) -> "RankStart":
        """claim: rank 0 claims the run folder now (an elastic job's worker claims it when it becomes rank 0:
        rank/elastic.py)."""
        # The launcher names the attempt; a rank started some other way (plain mpirun) makes one up.
        attempt = os.environ.get(ATTEMPT_ENV) or uuid.uuid4().hex
        os.environ[ATTEMPT_ENV] = attempt
        run_store = open_store(cfg.run_uri)
        liveness = Liveness(attempt, cfg.health, rank, on_stall)
        liveness.start()  # the claim below is watched too: a store that moves nothing is the store's verdict
        start = cls(attempt, run_store, liveness, None)
        if rank == 0 and claim:
            start.claim()
        return start

    def claim(self) -> None:
        """Make this attempt the run folder's current one, with this process as its writer, and start the
        heartbeat. Again in an elastic job whose rank 0 died: the new rank 0's claim fences the old one."""
        run_store, attempt = self.run_store, self.attempt
        self.guard = store_call(self.liveness.progress, "claim of the run folder", run_store,
                                lambda moved: FenceGuard.claim(run_store, attempt))
        self.liveness.start_heartbeat(self.guard.store, before_write=self.guard.check)


# How long a rank stopping on a liveness verdict tries to record it (the store may be what is stuck).
LAST_WORD_SECONDS = 30.0


def within(seconds: float, call) -> None:
    """Run `call` on a thread of its own and wait at most `seconds` for it (errors printed, not raised)."""
    def run():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the last word is best effort
            print(f"[ringflow] could not record how the attempt ended: {exc!r}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=run, name="ringflow-last-word", daemon=True)
    thread.start()
    thread.join(seconds)


def liveness_record(verdict: Verdict, rank: int) -> dict:
    """The health record that carries a liveness verdict (verdict.py reads it back as the same verdict)."""
    if verdict.status == STALLED:
        e = verdict.evidence
        return record("stall", rank=rank, last_step=e["last_step"], seconds=e["seconds"], limit=e["limit"],
                      phase=e.get("phase"))
    return store_record(verdict)


def store_record(verdict: Verdict) -> dict:
    e = verdict.evidence
    return record("store", store=e["store"], operation=e["operation"], seconds=e["seconds"], limit=e["limit"],
                  seen_by=e["seen_by"], error=e.get("error"), last_step=e.get("last_step"))


def write_failed_result(start: RankStart, world_size: int, verdict: Verdict) -> None:
    """Rank 0's last word when it stops before the Trainer exists (during the rendezvous)."""
    if start.guard is None:
        return
    start.guard.check()
    within(LAST_WORD_SECONDS, lambda: start.guard.publish_result(RunResult(
        status=FAILED, attempt=start.attempt, step=0, epoch=0, world_size=world_size, verdict=verdict).to_json()))


def begin_early(cfg: JobConfig) -> RankStart | None:
    """Begin before the engine's rendezvous, when the launcher's environment names this rank (else the
    Trainer begins once the engine knows it): a rank that never gets past the rendezvous is still judged."""
    rank = launcher_rank(os.environ)
    if rank is None:
        return None
    world_size = launcher_world_size(os.environ) or 1
    holder: list[RankStart] = []

    def on_stall(verdict: Verdict) -> None:
        print(f"[ringflow] rank {rank}: {verdict.reason}", file=sys.stderr, flush=True)
        if holder:
            write_failed_result(holder[0], world_size, verdict)
        os._exit(exit_codes.for_verdict(verdict.status))

    holder.append(RankStart.begin(cfg, rank, on_stall))
    return holder[0]


def store_failure(exc: BaseException, cfg: JobConfig, seconds: float) -> Verdict:
    """A store that failed after every retry, or cannot be reached, as the verdict it means."""
    return store_unavailable(getattr(exc, "where", None) or cfg.run_uri, "a store operation", seconds, None,
                             "the training thread", error=str(exc))


def store_failed(exc: BaseException, cfg: JobConfig, seconds: float, rank: int, world_size: int, trainer,
                 start: RankStart | None) -> int:
    """A store that kept failing (or cannot be reached): its own verdict, not a crash. Rank 0 records it
    (through `trainer`, the engine's trainer with guard, health_log and result(), once it exists; else
    through `start`); the exit code it means."""
    verdict = store_failure(exc, cfg, seconds)
    print(f"[ringflow] rank {rank}: {verdict.reason}", file=sys.stderr, flush=True)
    if trainer is not None and trainer.guard is not None and trainer.health_log is not None:
        trainer.guard.check()
        trainer.health_log.append(store_record(verdict))
        within(LAST_WORD_SECONDS, lambda: (trainer.health_log.close(), trainer.guard.publish_result(
            trainer.result(FAILED, verdict, None).to_json())))
    elif start is not None:
        write_failed_result(start, world_size, verdict)
    return exit_codes.for_verdict(verdict.status)
