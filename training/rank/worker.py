"""One rank of a training job: load its partition, resume, run the training loop with its callbacks, and
(rank 0) write how it ended as result.json. Runs under horovodrun, mpirun or torchrun (`python -m
ringflow.training CONFIG`).

The loop itself is loop.py; health, liveness, checkpoints, faults, logging and throughput are callbacks on
it (callbacks/); the data-parallel library is behind engine.py (engines/: Horovod, DDP).

Liveness starts first, before the engine's rendezvous when the launcher's environment names the rank, and
start-up marks its phases on it (rendezvous, fetch, restore, first step): every store read on the training
thread is a wait for the store (health/progress.py), so a slow store during start-up is never a stall.
No store write happens on the training thread while training: checkpoints upload in the background
(checkpoint_writer.py), health records are written by their own thread (records.py), the heartbeat by its.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
import uuid
from typing import Sequence

import torch

from ..formats import exit_codes
from .callbacks.base import Callback
from .callbacks.checkpointing import Checkpointing
from .callbacks.faults import FaultInjection
from .callbacks.garbage_collection import ScheduledGarbageCollection
from .callbacks.health import HealthMonitoring
from .callbacks.liveness import Liveness
from .callbacks.logging import ProgressLog, say
from .callbacks.throughput import Throughput
from ..formats.checkpoint import CheckpointStore, LoadedCheckpoint, SkippedCheckpoint
from .checkpoint_writer import AsyncCheckpointWriter, WrittenCheckpoint
from .fence_guard import FenceGuard
from ..formats.run_folder import RunFolder
from ..formats.config import JobConfig
from .data import Cursor, PartitionData
from .engine import Engine
from .engines import start_engine
from .monitor import SyncHealthMonitor
from ..health.progress import FETCH, RESTORE, Progress
from ..health.records import HealthLog, record
from ..health.store_ops import StoreOp
from ..health.memory_limits import MemoryLimits
from ..health.oom import classify, oom_line, oom_verdict
from ..health.oom_advice import JobShape
from ..health.verdict import STALLED, STORE_UNAVAILABLE, Verdict, store_unavailable
from .loop import TrainingLoop, last_step_of
from ..formats.manifest import ShardManifest, split_manifest_uri
from .models import build_model
from .oom_report import oom_evidence
from ..formats.run_result import FAILED, SUCCEEDED, ResultError, RunResult
from ..store import ObjectStore, StoreConfigError, StoreUnavailable, open_store
from .training_state import STATE_FILE, TrainingState
from .worker_env import ATTEMPT_ENV, launcher_rank, launcher_world_size


def make_optimizer(cfg: JobConfig, model: torch.nn.Module, world_size: int) -> torch.optim.Optimizer:
    # Linear scaling: the effective batch is world_size times the per-worker batch.
    lr = cfg.learning_rate * world_size
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=lr)


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

    @classmethod
    def begin(cls, cfg: JobConfig, rank: int, on_stall) -> "RankStart":
        # The launcher names the attempt; a rank started some other way (plain mpirun) makes one up.
        attempt = os.environ.get(ATTEMPT_ENV) or uuid.uuid4().hex
        os.environ[ATTEMPT_ENV] = attempt
        run_store = open_store(cfg.run_uri)
        liveness = Liveness(attempt, cfg.health, rank, on_stall)
        liveness.start()  # the claim below is watched too: a store that moves nothing is the store's verdict
        guard = None
        if rank == 0:
            guard = store_call(liveness.progress, "claim of the run folder", run_store,
                               lambda moved: FenceGuard.claim(run_store, attempt))
            liveness.start_heartbeat(guard.store, before_write=guard.check)
        return cls(attempt, run_store, liveness, guard)


class Trainer:
    def __init__(self, cfg: JobConfig, engine: Engine, callbacks: Sequence[Callback] = (),
                 start: RankStart | None = None):
        """callbacks: more callbacks on the loop, after fault injection and before the built-in ones.
        start: begun by main() before the engine's rendezvous; else begun here."""
        self.cfg, self.engine = cfg, engine
        self.rank, self.size = engine.rank, engine.size
        self.step, self.cursor, self.resumed_from, self.last_loss = 0, Cursor(), None, float("nan")
        self.replica_optimizers: list | None = None  # each rank's optimizer state, from a local-SGD checkpoint
        self.skipped_checkpoints: list[SkippedCheckpoint] = []
        self.loop: TrainingLoop | None = None
        self.throughput: Throughput | None = None
        self.checkpointing: Checkpointing | None = None
        self.health_log: HealthLog | None = None
        # Liveness started before anything that can hang: reading the data and the checkpoint from a store,
        # the first collectives on a dead peer.
        start = start or RankStart.begin(cfg, self.rank, lambda verdict: self.on_stall(verdict))
        self.attempt, self.run_folder, self.guard = start.attempt, start.run_store, start.guard
        self.liveness = start.liveness
        self.liveness.on_stall = self.on_stall
        progress = self.progress = self.liveness.progress
        progress.phase(FETCH)
        # What the run folder published (run_folder.py): the checkpoint to resume from, a finished run's verdict.
        self.published = RunFolder(self.run_folder).checkpoints
        guard = self.guard
        self.health_log = HealthLog(guard.store if guard else self.run_folder, cfg.health.flush_seconds,
                                    enabled=guard is not None, attempt=self.attempt,
                                    first_seq=guard.attempt.ref.first_seq if guard else 0,
                                    before_write=(lambda: guard.check(max_age=cfg.health.heartbeat_interval()))
                                    if guard else (lambda: None))
        self.health_log.start_flushing()
        manifest_store, manifest_key = split_manifest_uri(cfg.manifest_uri)
        manifest = self.manifest = store_call(progress, f"read of {manifest_key}", manifest_store, lambda moved:
                                              ShardManifest.from_json(manifest_store.get_bytes(manifest_key,
                                                                                               progress=moved)))
        # The engine chose this rank's device and precision when it started (devices.py).
        placement = engine.placement
        self.data = PartitionData(manifest_store, manifest, self.rank, self.size, cfg.batch_size,
                                  placement=placement, progress=progress)
        if self.data.batches_per_epoch == 0:
            raise ValueError(f"batch_size {cfg.batch_size} exceeds the partition's {self.data.rows} rows")
        torch.manual_seed(cfg.seed)
        schema = manifest.schema
        self.model, self.loss_fn = build_model(cfg.model, schema.num_features, schema.num_outputs, schema.task,
                                               input_shape=schema.input_shape)
        # On its device before the optimizer holds its parameters; a checkpoint's CPU tensors are copied in.
        self.model = engine.precision.prepare(self.model.to(placement.device))
        self.optimizer = engine.distribute(self.model, make_optimizer(cfg, self.model, self.size))
        progress.phase(RESTORE)
        self._resume()
        engine.broadcast_state(self.model, self.optimizer)
        engine.restore_replica_optimizer(self.optimizer, self.replica_optimizers)
        # After which steps every rank's replica agrees (all, unless local SGD): where checksums are compared
        # and checkpoints taken.
        schedule = engine.replica_schedule(self.step, last_step_of(cfg.epochs, self.data.batches_per_epoch,
                                                                    engine.accumulation_steps))

        self.monitor = SyncHealthMonitor(engine, cfg.health, self.health_log, cfg.batch_size, schedule)
        writer = (AsyncCheckpointWriter(CheckpointStore(guard.store, keep_last=None), progress,
                                        self._on_checkpoint_written, self._publish_checkpoint)
                  if guard is not None else None)
        self.checkpointing = Checkpointing(writer, cfg.checkpoint.cadence_steps, self.size, {
            "manifest_uri": cfg.manifest_uri, "model": json.loads(json.dumps(cfg.to_dict()["model"])),
            "schema": {"num_features": schema.num_features, "input_shape": list(schema.input_shape),
                       "num_outputs": schema.num_outputs, "task": schema.task}}, pin_memory=placement.pin_memory,
            progress=progress, floor_seconds=cfg.checkpoint.floor_seconds, schedule=schedule)
        self.health = HealthMonitoring(self.monitor, self.health_log, cfg.health, self.rank, self.checkpointing.due,
                                       {"world_size": self.size, "engine": engine.name,
                                        "device": placement.device, "precision": cfg.precision,
                                        "resumed_from": self.resumed_from, "health": self._health_dict()})
        self.throughput = Throughput(engine, lambda: self.health.seconds_in_monitor)
        self.garbage_collection = (ScheduledGarbageCollection(cfg.gc_every_steps) if cfg.gc_every_steps else None)
        # In this order on every hook: faults act before anything measures, the health verdict comes before
        # the final checkpoint, and a checkpoint is taken last in a step.
        # Fault injection only on a rank with faults to inject: its hooks run on every micro-batch.
        faults = FaultInjection(cfg, self.rank)
        self.callbacks: list[Callback] = [
            *([faults] if faults.active else []), *callbacks, self.throughput, self.health, self.liveness,
            ProgressLog(self.rank, self.size, cfg.log_every_steps, cfg.batch_size, cfg.learning_rate),
            *([self.garbage_collection] if self.garbage_collection else []), self.checkpointing]

    def _publish_checkpoint(self, name: str) -> None:
        """From the writer's thread: make `name` the run folder's newest checkpoint, then delete what that
        dropped from keep_last (its MANIFEST first, so a reader never meets a half-deleted one as complete)."""
        for key in self.guard.publish_checkpoint(name, self.cfg.checkpoint.keep_last):
            self.run_folder.delete(f"{key}/MANIFEST.json")
            self.run_folder.delete_prefix(f"{key}/")

    def _on_checkpoint_written(self, written: WrittenCheckpoint) -> None:
        """From the writer's thread: what the checkpoint cost, in the health log and the job's log."""
        self.health_log.append(record("checkpoint", **dataclasses.asdict(written)))
        waited = f", waited {written.waited_seconds:.1f}s for the previous upload" if written.waited_seconds > 0.05 else ""
        say(f"checkpoint {written.name} written: {written.bytes / 2**20:.1f} MiB in {written.write_seconds:.1f}s in "
            f"the background (snapshot {written.snapshot_seconds * 1000:.0f} ms{waited})")

    def _resume(self) -> None:
        # Every rank reads the checkpoint itself; the broadcast that follows makes rank 0's copy the truth.
        def decode(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, TrainingState]:
            # An unsafe state.pt (UnsafeCheckpoint, a CheckpointCorrupt) is skipped like a corrupt file.
            return loaded, TrainingState.from_bytes(loaded.files[STATE_FILE],
                                                    f"{self.run_folder.uri} {loaded.manifest.name}/{STATE_FILE}")

        def newest_safe(moved):
            self.skipped_checkpoints = []  # a retried read starts over
            return self.published().latest_valid(progress=moved, decode=decode, skipped=self.skipped_checkpoints)

        found = store_call(self.progress, "read of the newest checkpoint", self.run_folder, newest_safe)
        if found is None:
            return
        loaded, state = found
        self.model.load_state_dict(state.model)
        self.optimizer.load_state_dict(state.optimizer)
        scaler = self.engine.precision.scaler
        if scaler is not None and state.grad_scaler:  # fp16 goes on with its loss scale (not from fp32/bf16)
            scaler.load_state_dict(state.grad_scaler)
        self.cursor, self.step = Cursor(*state.cursor), state.step
        self.replica_optimizers = state.replica_optimizers
        torch.set_rng_state(state.torch_rng)
        self.resumed_from = loaded.manifest.name
        self.last_loss = loaded.manifest.meta.get("loss", float("nan"))
        if self.rank == 0:
            say(f"resuming from checkpoint {loaded.manifest.name} (step {self.step}, epoch {self.cursor.epoch}, "
                f"batch {self.cursor.batch})")

    def _health_dict(self) -> dict:
        # The run's own thresholds, kept with its records: `ringflow health RUN` judges with them.
        return self.cfg.to_dict()["health"]

    def write_result(self, status: str, verdict: Verdict | None, checkpoint: str | None) -> RunResult:
        """This attempt's outcome, the same on every rank; rank 0 writes it (result.json), after the health
        records it has not yet written."""
        result = self.result(status, verdict, checkpoint)
        if self.guard is not None:
            self.health_log.append(record("end", status=status, step=result.step))
            self.health_log.close()
            self.guard.publish_result(result.to_json())
        return result

    def result(self, status: str, verdict: Verdict | None, checkpoint: str | None) -> RunResult:
        at = self.loop if self.loop is not None else self  # where training stands now
        throughput = self.throughput
        return RunResult(status=status, attempt=self.attempt, step=at.step, epoch=at.cursor.epoch,
                         world_size=self.size, checkpoint=checkpoint, verdict=verdict, loss=at.last_loss,
                         resumed_from=self.resumed_from, skipped_checkpoints=tuple(self.skipped_checkpoints),
                         samples_per_sec_after_warmup=throughput.samples_per_sec if throughput else None,
                         health_monitor_share_after_warmup=throughput.monitor_share if throughput else None,
                         checkpoint_blocked_seconds=(self.checkpointing.blocked_seconds
                                                     if self.checkpointing is not None and self.rank == 0 else None))

    def stop_on(self, verdict: Verdict) -> int:
        if self.rank == 0:
            say(f"health verdict {verdict.status}: {verdict.reason}")
            say(f"evidence: {json.dumps(dict(verdict.evidence), default=str)}")
            if verdict.status == STORE_UNAVAILABLE:
                self.health_log.append(store_record(verdict))
        result = self.write_result(FAILED, verdict, None)
        self.liveness.stop()
        return result.exit_code

    def on_stall(self, verdict: Verdict) -> None:
        """The watchdog's call, from its thread, while the training thread is stuck or waits for a store
        that moves nothing: record, then exit."""
        print(f"[ringflow] rank {self.rank}: {verdict.reason}", file=sys.stderr, flush=True)
        if self.guard is not None:
            self.guard.check()  # a fenced attempt (frozen, then thawed) says nothing more
            self.health_log.append(liveness_record(verdict, self.rank))
            # The store may be what is stuck: the last word gets a while, then the process goes anyway.
            within(LAST_WORD_SECONDS, lambda: (self.health_log.close(), self.guard.publish_result(
                self.result(FAILED, verdict, None).to_json())))
        else:
            time.sleep(5)  # give rank 0 the chance to record the verdict before the job is torn down
        os._exit(exit_codes.for_verdict(verdict.status))

    def carried_verdict(self) -> Verdict | None:
        """The verdict of the attempt that wrote the final checkpoint this attempt resumed from."""
        meta = self.published().read_manifest(self.resumed_from).meta
        if "verdict" in meta:
            doc = meta["verdict"]
            return Verdict(doc["status"], doc.get("reason", ""), doc.get("evidence") or {}) if doc else None
        try:  # a checkpoint from before verdicts were kept with it: the result that named it, if any
            result = RunFolder(self.run_folder).read_result()
        except ResultError:
            return None
        if result is not None and result.succeeded and result.checkpoint == self.resumed_from:
            return result.verdict
        return None

    def finish_finished(self) -> int:
        """A rerun of a job that had already finished: it resumed at its final checkpoint with nothing
        left to train or measure, so it reports that checkpoint and its verdict again (a `null` verdict
        would fail the promotion gate)."""
        verdict = self.carried_verdict() if self.rank == 0 else None
        if self.rank == 0:
            self.health_log.append(record("start", world_size=self.size, step=self.step,
                                          resumed_from=self.resumed_from, health=self._health_dict(),
                                          finished_already=True), force_flush=True)
            say(f"already finished at step {self.step} ({self.resumed_from}); health verdict "
                f"{verdict.status if verdict else None}, carried from the attempt that finished it")
        result = self.write_result(SUCCEEDED, verdict, self.resumed_from)
        self.liveness.stop()
        return result.exit_code

    def train(self) -> int:
        cfg = self.cfg
        # What memory this rank has, said once in the log: if the kernel's OOM killer ends it, nothing can be
        # read from the dead process, and the launcher compares its cgroup's OOM kills with this
        # (core/backends/processes/oom_watch.py).
        print(MemoryLimits.read(self.rank).line(), file=sys.stderr, flush=True)
        if self.resumed_from is not None and self.cursor.epoch >= cfg.epochs:
            return self.finish_finished()
        self.loop = TrainingLoop(self.engine, self.engine.training_model(self.model), self.loss_fn, self.optimizer, self.data, cfg.epochs,
                                 cfg.seed, cfg.health.stop_on_degraded, self.callbacks, step=self.step,
                                 cursor=self.cursor, last_loss=self.last_loss)
        try:
            stop = self.loop.run()
        finally:
            if self.garbage_collection is not None:
                self.garbage_collection.restore()
        if stop is not None:
            return self.stop_on(stop)
        final = self.checkpointing.final
        result = self.write_result(SUCCEEDED, self.health.last_verdict, final)
        self.liveness.stop()
        if self.rank == 0:
            say(f"done: step {self.loop.step}, loss {self.loop.last_loss:.4f}, final checkpoint {final}")
        return result.exit_code


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


def main(cfg: JobConfig) -> int:
    started = time.monotonic()
    start = begin_early(cfg)
    engine = start_engine(cfg)  # the one its launcher was chosen for (engines.ENGINE_ENV), else cfg.engine
    trainer = None
    try:
        trainer = Trainer(cfg, engine, start=start)
        return trainer.train()
    except (StoreUnavailable, StoreConfigError) as exc:
        # The store kept failing (or cannot be reached): its own verdict, not a crash.
        verdict = store_failure(exc, cfg, time.monotonic() - started)
        print(f"[ringflow] rank {engine.rank}: {verdict.reason}", file=sys.stderr, flush=True)
        if trainer is not None and trainer.guard is not None and trainer.health_log is not None:
            trainer.guard.check()
            trainer.health_log.append(store_record(verdict))
            within(LAST_WORD_SECONDS, lambda: (trainer.health_log.close(), trainer.guard.publish_result(
                trainer.result(FAILED, verdict, None).to_json())))
        elif start is not None:
            write_failed_result(start, engine.size, verdict)
        return exit_codes.for_verdict(verdict.status)
    except Exception as exc:
        kind = classify(exc)
        if kind is None:
            raise
        return on_oom(exc, kind, cfg, engine, trainer, start)
    finally:
        engine.shutdown()


def on_oom(exc: BaseException, kind: str, cfg: JobConfig, engine: Engine, trainer: "Trainer | None",
           start: RankStart | None) -> int:
    """This rank ran out of memory: its verdict in the log (every rank: a rank other than 0 writes nothing
    else anyone reads), and on rank 0 in its health records and result; then the job ends with its code."""
    # The step it was training: the one after the last it completed (none before the loop began).
    step = trainer.loop.step + 1 if trainer is not None and trainer.loop is not None else None
    evidence = oom_evidence(exc, kind, engine.rank, step, engine.placement.cuda)
    verdict = oom_verdict(evidence, JobShape.of(cfg, engine.size))
    print(f"[ringflow] rank {engine.rank}: health verdict OOM: {verdict.reason}", file=sys.stderr, flush=True)
    print(oom_line(verdict), file=sys.stderr, flush=True)
    if trainer is not None and trainer.guard is not None and trainer.health_log is not None:
        trainer.guard.check()
        trainer.health_log.append(record("oom", reason=verdict.reason, evidence=dict(verdict.evidence)))
        within(LAST_WORD_SECONDS, lambda: (trainer.health_log.close(), trainer.guard.publish_result(
            trainer.result(FAILED, verdict, None).to_json())))
    elif start is not None:
        write_failed_result(start, engine.size, verdict)
    if trainer is not None:
        trainer.liveness.stop()
    return exit_codes.for_verdict(verdict.status)
