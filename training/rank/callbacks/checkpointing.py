"""Checkpoint cadence: due every checkpoint.every_steps steps, taken when checkpoint.min_interval_seconds have
passed since the last one (by rank 0's clock), and the final one when every step ran.

Rank 0 takes a snapshot of the state (model, optimizer, cursor, step, RNG: training_state.py) at the step
and hands it to the background writer (checkpoint_writer.py), so the upload runs while training goes on;
what a reader needs without torch (model config, schema, world size, the final verdict) goes in the
manifest's meta. Other callbacks add to the meta (`before_checkpoint`) and learn that a checkpoint was taken
(`on_checkpoint`). A write that failed stops the loop with its verdict: NONFINITE for a state holding
NaN/Inf (never written), STORE_UNAVAILABLE for a store that kept failing. The final checkpoint is complete
before the loop reports it.

A checkpoint due while rank 0's previous upload still runs waits for it on EVERY rank, together: rank 0 waits
for its writer as a wait for the store, and the ranks exchange its word (still uploading; done; failed) about
once a second with a small allgather, each round a sign of life (Progress.alive). Without it the other ranks
would sit in the next step's all-reduce, silent, and call a slow upload a stall.

The time floor is rank 0's decision, carried by the same word: at a due step rank 0 says SKIP when the last
checkpoint is younger than the floor, and no rank takes this one (every rank reads the same word, so they agree
without a clock of their own). Skipping costs one small allgather every every_steps steps.
"""
from __future__ import annotations

import time

from typing import Any, Mapping

import torch

from ...formats import exit_codes
from .base import Callback
from ..checkpoint_writer import AsyncCheckpointWriter, NonFiniteState
from ...formats.checkpoint import checkpoint_name
from ...health.progress import Progress
from ...health.replica_schedule import SYNCHRONOUS, ReplicaSchedule
from ...health.verdict import NONFINITE, Verdict, store_unavailable
from ...store.base import StoreConfigError, StoreUnavailable
from ..training_state import TrainingState


def training_state(loop, replica_optimizers: list | None = None) -> TrainingState:
    """The loop's state now, sharing tensors with the live model and optimizer (host_copy() detaches it).
    replica_optimizers: every rank's optimizer state where they differ (Engine.replica_optimizer_states)."""
    # The user's module, not an engine's wrapper of it: the same keys whichever engine trained it.
    scaler = loop.engine.precision.scaler
    # Settled: what of the epoch is unseen, which a resume on any world size deals (stream_deal.py).
    cursor = loop.data.settled(loop.cursor)
    return TrainingState(model=loop.engine.unwrap(loop.model).state_dict(), optimizer=loop.optimizer.state_dict(),
                         cursor=(cursor.epoch, cursor.batch), step=loop.step,
                         torch_rng=torch.get_rng_state(),
                         grad_scaler=scaler.state_dict() if scaler is not None else None,
                         replica_optimizers=replica_optimizers, remaining=cursor.remaining)


def serialize_state(loop) -> bytes:
    return training_state(loop).to_bytes()


# Rank 0's word on its previous upload, as every rank reads it in the wait: still uploading, done, or failed
# with the exit code of its verdict (exit_codes.BY_VERDICT: NONFINITE, STORE_UNAVAILABLE).
UPLOADING, DONE = -1, 0
# Rank 0's word at a due step when the last checkpoint is younger than the time floor: nobody takes this one.
SKIP = -2
# How often the ranks exchange it while rank 0 waits.
WAIT_ROUND_SECONDS = 1.0


# What _previous_written returns for a due step rank 0 said to skip (distinct from None: "done, take it").
SKIPPED = object()


class Checkpointing(Callback):
    def __init__(self, writer: AsyncCheckpointWriter | None, every_steps: int, world_size: int,
                 run_meta: Mapping[str, Any], pin_memory: bool = False, progress: Progress | None = None,
                 floor_seconds: float = 0.0, clock=time.monotonic, schedule: ReplicaSchedule = SYNCHRONOUS):
        """writer: rank 0's background writer; None on the other ranks, which write nothing.
        run_meta: what every checkpoint of this run says about it (manifest_uri, model, schema).
        progress: this rank's (liveness).
        floor_seconds: the least time between two checkpoints, by rank 0's `clock` (0: every due step).
        schedule: after which steps the replicas agree (health/replica_schedule.py)."""
        self._writer, self._every, self._size = writer, every_steps, world_size
        self._schedule = schedule
        self._floor, self._clock = floor_seconds, clock
        self._last_taken = clock()
        self.skipped = 0  # due steps not taken because of the floor (rank 0 counts; every rank skips them)
        self._run_meta = dict(run_meta)
        self._pin_memory = pin_memory
        self._progress = progress or Progress()
        self.final: str | None = None

    @property
    def blocked_seconds(self) -> float:
        return self._writer.blocked_seconds if self._writer is not None else 0.0

    @property
    def writer(self) -> AsyncCheckpointWriter | None:
        """Rank 0's background writer (None on the other ranks)."""
        return self._writer

    def settle(self, seconds: float) -> bool:
        """Wait at most `seconds` for the checkpoint in flight (rank 0's; as a wait for the store): whether
        none is left. A replay reads the newest published checkpoint after it."""
        return self._writer.wait_for(seconds) if self._writer is not None else True

    def due(self, step: int) -> bool:
        # Under local SGD, at the first average at or after each multiple of every_steps: rank 0's replica
        # (which the checkpoint holds) is then every rank's.
        return self._schedule.due(step, self._every)

    def on_train_start(self, loop) -> None:
        self._last_taken = self._clock()  # the floor counts from the first step, not from start-up

    def _too_soon(self) -> bool:
        """Rank 0: the last checkpoint (or the first step) is younger than the floor."""
        return self._writer is not None and self._clock() - self._last_taken < self._floor

    def on_step_end(self, loop, timing) -> Verdict | None:
        if not self.due(timing.step):
            return None
        started = time.perf_counter()
        previous = self._previous_written(loop, may_skip=True)
        if previous is SKIPPED:
            self.skipped += 1
            return None
        return previous or self._save(loop, waited=time.perf_counter() - started)

    def on_train_end(self, loop) -> Verdict | None:
        started = time.perf_counter()
        verdict = (self._previous_written(loop) or self._save(loop, final=True, waited=time.perf_counter() - started)
                   or self._wait_alone())
        if verdict is not None:  # the final checkpoint is complete before anyone reports it, or there is none
            self.final = None
        return verdict

    def _previous_written(self, loop, may_skip: bool = False):
        """Every rank: return once rank 0's previous upload is done (None), or with the verdict it failed on;
        SKIPPED at once when `may_skip` and rank 0 says the floor has not passed."""
        if self._size == 1:
            return SKIPPED if may_skip and self._too_soon() else self._wait_alone()
        # Rank 0 waits up to a round for its writer, as a wait for the store (the writer's wait_for); every rank
        # then exchanges rank 0's word. The exchange is not a wait for the store: a peer that never comes to it
        # (frozen, its host gone) is silence, judged by stall_seconds, whatever the store does. Each round
        # that goes through while rank 0 still uploads is a sign of life on every rank; a store that moves
        # nothing for store_timeout_seconds is rank 0's finding (STORE_UNAVAILABLE), and it stops the job.
        skip = may_skip and self._too_soon()  # rank 0's decision, made once: the first round carries it
        while True:
            word = SKIP if skip else self._rank0_word()
            word = int(loop.engine.allgather(torch.tensor([[float(word)]], dtype=torch.float64),
                                             name="ringflow.checkpoint_wait")[0, 0])
            if word != UPLOADING:
                break
            self._progress.alive()
        if word == SKIP:
            return SKIPPED
        if word == DONE:
            return None
        if self._writer is not None:
            return self._wait_alone()  # rank 0's own verdict, with its detail
        return Verdict(exit_codes.VERDICT_OF[word], "rank 0's checkpoint write failed; its log and result.json "
                       "say why", {"seen_by": "a rank waiting for rank 0's checkpoint"})

    def _wait_alone(self) -> Verdict | None:
        if self._writer is None:
            return None
        try:
            self._writer.wait()
        except Exception as exc:  # noqa: BLE001 - turned into the verdict it means, or raised
            return self._verdict(exc)
        return None

    def _rank0_word(self) -> int:
        """Rank 0's word on its upload after waiting for it up to a round; the other ranks' own words are
        ignored."""
        if self._writer is None:
            return UPLOADING
        if not self._writer.wait_for(WAIT_ROUND_SECONDS):
            return UPLOADING
        failure = self._writer.failed()
        if failure is None:
            return DONE
        return exit_codes.for_verdict(self._verdict(failure).status)

    def meta(self, loop, final: bool = False) -> dict[str, Any]:
        """What a checkpoint taken now says about the run in its manifest (an elastic commit says the same:
        rank/elastic.py): the step, the settled cursor, the world size, accumulation and batch, the run's own."""
        cursor = loop.data.settled(loop.cursor)
        meta = {"step": loop.step, "epoch": cursor.epoch, "cursor": [cursor.epoch, cursor.batch],
                "loss": loop.last_loss, "world_size": self._size,
                "accumulation_steps": loop.engine.accumulation_steps, "batch_size": loop.data.batch_size,
                "final": final} | self._run_meta
        if cursor.remaining is not None:
            meta["remaining"] = [list(pair) for pair in cursor.remaining]
        return meta

    def _save(self, loop, final: bool = False, waited: float = 0.0) -> Verdict | None:
        """Take the checkpoint (rank 0 hands it to the writer); its name on every rank. waited: how long every
        rank waited for the previous upload (_previous_written), recorded with this checkpoint."""
        # Every rank takes part (local SGD gathers each rank's optimizer state to rank 0); None elsewhere.
        replicas = loop.engine.replica_optimizer_states(loop.optimizer)
        if self._writer is None:
            if final:
                self.final = checkpoint_name(loop.step)
            return None
        meta = self.meta(loop, final)
        for callback in loop.callbacks:
            callback.before_checkpoint(loop, meta, final)
        self._last_taken = self._clock()
        try:
            writer = self._writer
            name = writer.submit(loop.step, lambda: writer.snapshot(training_state(loop, replicas), self._pin_memory), meta,
                                 final, waited_before=waited)
        except Exception as exc:  # noqa: BLE001 - what the previous write raised
            return self._verdict(exc)
        for callback in loop.callbacks:
            callback.on_checkpoint(loop, name, final)
        if final:
            self.final = name
        return None

    def _verdict(self, failure: BaseException) -> Verdict:
        if isinstance(failure, NonFiniteState):
            return Verdict(NONFINITE,
                           f"{failure}: lower the learning rate, check the input data for NaN/Inf, or clip "
                           "gradients; resume from the last checkpoint (written before)",
                           {"step": failure.step, "tensors": failure.tensors[:20], "seen_by": "the checkpoint writer"})
        if isinstance(failure, (StoreUnavailable, StoreConfigError, OSError)):
            return store_unavailable(self._writer.store_uri, "a checkpoint upload", self._writer.last_write_seconds,
                                     None, "the checkpoint writer of rank 0", error=str(failure))
        raise failure
