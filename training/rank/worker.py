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
import time
from typing import Sequence

import torch

from .callbacks.base import Callback
from .callbacks.checkpointing import Checkpointing, training_state
from .callbacks.faults import FaultInjection
from .callbacks.garbage_collection import ScheduledGarbageCollection
from .callbacks.health import HealthMonitoring
from .callbacks.logging import ProgressLog, say
from .callbacks.row_log import RowLog
from .callbacks.throughput import Throughput
from .callbacks.trainer_status import TrainerStatusReporting
from ..formats.checkpoint import (CheckpointStore, LoadedCheckpoint, SkippedCheckpoint, first_loadable,
                                  require_file, step_of)
from .checkpoint_writer import AsyncCheckpointWriter, WrittenCheckpoint
from ..formats.config import JobConfig
from .data import Cursor, PartitionData
from .engine import Engine
from .engines import ENGINE_ENV, engine_name, start_engine
from ..formats.engines import DDP
from .monitor import SyncHealthMonitor
from ..health.progress import RESTORE
from ..health.records import HealthLog, record
from ..health.verdict import Verdict
from .loop import TrainingLoop, last_step_of
from .models import build_model
from .node_names import gather_node_names
from ..formats.replay_report import ReplayReport, replay_evidence, step_to_replay
from ..formats.run_folder import RunFolder
from ..formats.run_result import FAILED, SUCCEEDED, RunResult
from .training_state import STATE_FILE, TrainingState
from .trainer_status_reporter import TrainerStatusReporter
from .rank_run import RankRun, run_rank, unreplayed
from .replay import StepReplay
from .replay_exchange import (GRACE_SECONDS, gather_reports, gathered, publish_report, replay_started,
                              wait_for_result)
from .step_minibatches import step_minibatches
from .rank_start import RankStart, store_call
from . import stream_deal
from .world_size_change import WorldSizeChange, plan_change


def make_optimizer(cfg: JobConfig, model: torch.nn.Module, world_size: int) -> torch.optim.Optimizer:
    # Linear scaling: the effective batch is world_size times the per-worker batch.
    lr = cfg.learning_rate * world_size
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=lr)


class Trainer(RankRun):
    def __init__(self, cfg: JobConfig, engine: Engine, callbacks: Sequence[Callback] = (),
                 start: RankStart | None = None, elastic=None):
        """callbacks: more callbacks on the loop, after fault injection and before the built-in ones.
        start: begun by main() before the engine's rendezvous; else begun here.
        elastic: the elastic job's run (rank/elastic.py's ElasticRun, ddp_elastic.py's PeerCopyRun) this trainer
        is a round of: it resumes from the workers' newest commit when there is one (without rank 0's broadcast
        where every rank restored the same one: `restored_alike`), reads through its `host_ranges`, and commits
        every elastic.commit_every_steps."""
        self.cfg, self.engine, self.elastic = cfg, engine, elastic
        self.rank, self.size = engine.rank, engine.size
        self.step, self.cursor, self.resumed_from, self.last_loss = 0, Cursor(), None, float("nan")
        self.replica_optimizers: list | None = None  # each rank's optimizer state, from a local-SGD checkpoint
        self.world_size_changes: list[dict] = []  # the run's resumes on other world sizes (_plan_world_size)
        self.skipped_checkpoints: list[SkippedCheckpoint] = []
        self.loop: TrainingLoop | None = None
        self.throughput: Throughput | None = None
        self.checkpointing: Checkpointing | None = None
        self.health_log: HealthLog | None = None
        manifest_store, manifest = self._open(cfg, start)
        # The engine chose this rank's device and precision when it started (devices.py).
        self.data = PartitionData(manifest_store, manifest, self.rank, self.size, cfg.batch_size,
                                  placement=engine.placement, progress=self.progress, skip_rows=cfg.skip_rows,
                                  host_ranges=elastic.host_ranges if elastic is not None else None)
        if self.data.batches_per_epoch == 0:
            raise ValueError(f"batch_size {cfg.batch_size} exceeds the partition's {self.data.rows} rows")
        torch.manual_seed(cfg.seed)
        self.model, self.loss_fn = self._new_model()
        self.progress.phase(RESTORE)
        commit = elastic.state.committed if elastic is not None else None
        if commit is not None:  # a later round of an elastic job: the survivors' commit, as a checkpoint
            from .commits import as_found

            found = as_found(commit)
        else:
            found = self._find_checkpoint()
        resumes_at = found[1].resume_cursor if found is not None else Cursor()
        if resumes_at.epoch < cfg.epochs:  # the first window loads while the model is distributed and restored
            self.data.prefetch(cfg.seed, resumes_at)
        try:
            self._set_up(cfg, engine, callbacks, elastic, commit, found)
        except BaseException:
            self.data.close()  # its first window loading: a set-up that failed (a peer gone meanwhile) reads no more
            raise

    def _set_up(self, cfg: JobConfig, engine: Engine, callbacks: Sequence[Callback], elastic, commit, found) -> None:
        """The rest of __init__, once the state to resume from is found and its first window loads: the model
        distributed and restored, the loop's callbacks made."""
        progress, guard, placement, schema = self.progress, self.guard, engine.placement, self.manifest.schema
        # Before the optimizer is distributed: a resume on another world size changes the accumulation.
        self.world_size_change = self._plan_world_size(found)
        engine.accumulation_steps = self.world_size_change.accumulation_steps
        self.optimizer = engine.distribute(self.model, make_optimizer(cfg, self.model, self.size))
        if found is not None:
            self._restore(*found)
        if commit is not None:
            self.resumed_from = elastic.resumed_from  # the attempt's, from the run folder
        if commit is None or not elastic.restored_alike:
            engine.broadcast_state(self.model, self.optimizer)
        engine.restore_replica_optimizer(self.optimizer, self.replica_optimizers)
        # After which steps every rank's replica agrees (all, unless local SGD): where checksums are compared
        # and checkpoints taken.
        schedule = engine.replica_schedule(self.step, last_step_of(self.data, self.cursor, self.step, cfg.epochs,
                                                                    engine.accumulation_steps))

        self.monitor = SyncHealthMonitor(engine, cfg.health, self.health_log, cfg.batch_size, schedule)
        # Fault injection only on a rank with faults to inject: its hooks run on every micro-batch.
        # An elastic job's faults fire in its first round only: a crash that killed a worker is not dealt again
        # to whichever worker has its rank after the change.
        faults = self.faults = FaultInjection(
            cfg if elastic is None or elastic.round == 0 else dataclasses.replace(cfg, faults=()), self.rank)
        # A later round of an elastic job on the process that was already the writer takes its writer over,
        # with the upload that may still be in flight (rank/elastic.py ElasticRun.checkpoint_writer).
        carried = elastic.checkpoint_writer if elastic is not None else None
        if guard is None:
            writer = None
        elif carried is not None:
            writer = carried
            writer.hand_to(self._on_checkpoint_written, self._publish_checkpoint, faults.in_upload)
        else:
            writer = AsyncCheckpointWriter(CheckpointStore(guard.store, keep_last=None), progress,
                                           self._on_checkpoint_written, self._publish_checkpoint, faults.in_upload)
        self.checkpointing = Checkpointing(writer, cfg.checkpoint.cadence_steps, self.size, {
            "manifest_uri": cfg.manifest_uri, "model": json.loads(json.dumps(cfg.to_dict()["model"])),
            "learning_rate": cfg.learning_rate,  # the config's, per worker (_restore compares a retry's)
            "schema": {"num_features": schema.num_features, "input_shape": list(schema.input_shape),
                       "num_outputs": schema.num_outputs, "task": schema.task},
            **self.world_size_meta()}, pin_memory=placement.pin_memory,
            progress=progress, floor_seconds=cfg.checkpoint.floor_seconds, schedule=schedule)
        nodes = gather_node_names(engine)  # a collective: every rank of every round takes part
        later_round = elastic is not None and elastic.round > 0  # its `membership` record opens it
        self.health = HealthMonitoring(self.monitor, self.health_log, cfg.health, self.rank, self.checkpointing.due,
                                       None if later_round else {"world_size": self.size, "engine": engine.name,
                                        "device": placement.device, "precision": cfg.precision,
                                        "resumed_from": self.resumed_from, "health": self._health_dict(),
                                        "nodes": nodes,
                                        **({"world_size_change": self.world_size_change.as_record()}
                                           if self.world_size_change.changed else {})})
        self.throughput = Throughput(engine, lambda: self.health.seconds_in_monitor)
        self.garbage_collection = (ScheduledGarbageCollection(cfg.gc_every_steps) if cfg.gc_every_steps else None)
        # In this order on every hook: faults act before anything measures, the health verdict comes before
        # the final checkpoint, and a checkpoint is taken last in a step.
        # Rank 0 of a TrainJob reports progress into its status.trainerStatus (nothing elsewhere).
        reporter = TrainerStatusReporter.from_environ(os.environ) if self.rank == 0 else None
        self.callbacks: list[Callback] = [
            *([faults] if faults.active else []), *callbacks, self.throughput, self.health, self.liveness,
            ProgressLog(self.rank, self.size, cfg.log_every_steps, cfg.batch_size, cfg.learning_rate),
            *([RowLog(cfg.row_log_dir, self.attempt, self.rank, self.size,
                      elastic.round if elastic is not None else None)] if cfg.row_log_dir else []),
            *([self.garbage_collection] if self.garbage_collection else []),
            *([TrainerStatusReporting(reporter, self.size)] if reporter is not None else []), self.checkpointing]
        if elastic is not None:  # last: a commit holds what the step's checkpoint holds
            from .commits import ElasticCommit

            self.elastic_commit = ElasticCommit(elastic.state, cfg.elastic.commit_every_steps)
            self.callbacks.append(self.elastic_commit)

    def _new_model(self) -> tuple[torch.nn.Module, object]:
        """The config's model on this rank's device with its precision, and its loss: with torch seeded by
        cfg.seed first, the weights every run starts from."""
        schema, placement = self.manifest.schema, self.engine.placement
        model, loss_fn = build_model(self.cfg.model, schema.num_features, schema.num_outputs, schema.task,
                                     input_shape=schema.input_shape)
        # On its device before the optimizer holds its parameters; a checkpoint's CPU tensors are copied in.
        return self.engine.precision.prepare(model.to(placement.device)), loss_fn

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

    def _decode(self, loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, TrainingState]:
        # An unsafe state.pt (UnsafeCheckpoint, a CheckpointCorrupt) is skipped like a corrupt file.
        where = f"{self.run_folder.uri} {loaded.manifest.name}"
        data = require_file(loaded, STATE_FILE, where, self.engine.name)
        return loaded, TrainingState.from_bytes(data, f"{where}/{STATE_FILE}")

    def _find_checkpoint(self) -> tuple[LoadedCheckpoint, TrainingState] | None:
        """The newest safe checkpoint and its state, or None (a fresh run). Every rank reads it itself; the
        broadcast that follows the restore makes rank 0's copy the truth."""
        def newest_safe(moved):
            self.skipped_checkpoints = []  # a retried read starts over
            # Before cfg.resume_before_step when a remedy set it: the newest checkpoint may already hold what
            # the retry must not resume into (a NaN/Inf step's neighbourhood).
            return self.published().latest_valid(progress=moved, decode=self._decode,
                                                 skipped=self.skipped_checkpoints,
                                                 before_step=self.cfg.resume_before_step)

        return store_call(self.progress, "read of the newest checkpoint", self.run_folder, newest_safe)

    def _plan_world_size(self, found: tuple[LoadedCheckpoint, TrainingState] | None) -> WorldSizeChange:
        """This try's accumulation and learning-rate factor against the checkpoint's world size and per-worker
        batch (none: the config's, unchanged; the OOM remedy halves the batch). Also the run's history of
        changes, which every checkpoint carries on."""
        steps, batch = self.engine.accumulation_steps, self.cfg.batch_size  # the config's
        meta = found[0].manifest.meta if found is not None else {}
        self.base_world_size = int(meta.get("base_world_size", meta.get("world_size", self.size)))
        self.base_accumulation_steps = int(meta.get("base_accumulation_steps", steps))
        self.base_batch_size = int(meta.get("base_batch_size", meta.get("batch_size", batch)))
        self.world_size_changes = [dict(c) for c in meta.get("world_size_changes", ())]
        change = plan_change(int(meta.get("world_size", self.size)), int(meta.get("accumulation_steps", steps)),
                             self.base_world_size, self.base_accumulation_steps, self.size, batch,
                             from_batch_size=int(meta.get("batch_size", batch)), base_batch_size=self.base_batch_size)
        if change.changed:
            self.world_size_changes.append(change.as_record())
            if self.rank == 0:
                say(f"resuming with another global batch: {change.describe()}")
        return change

    def world_size_meta(self) -> dict:
        """What every checkpoint says about the run's world sizes and batches (read back by _plan_world_size)."""
        return {"base_world_size": self.base_world_size, "base_accumulation_steps": self.base_accumulation_steps,
                "base_batch_size": self.base_batch_size, "world_size_changes": self.world_size_changes}

    def _restore(self, loaded: LoadedCheckpoint, state: TrainingState) -> None:
        self.model.load_state_dict(state.model)
        self.optimizer.load_state_dict(state.optimizer)
        # The optimizer's state brings the checkpoint's learning rate: scaled linearly from its global batch to
        # this try's, and by this try's config rate against the checkpoint's (the NONFINITE remedy halves it;
        # without this the checkpoint's rate would undo the remedy).
        factor = self.world_size_change.lr_factor if self.world_size_change.changed else 1.0
        config_rate = loaded.manifest.meta.get("learning_rate")
        if config_rate:
            factor *= self.cfg.learning_rate / float(config_rate)
        if factor != 1.0:
            for group in self.optimizer.param_groups:
                group["lr"] *= factor
        scaler = self.engine.precision.scaler
        if scaler is not None and state.grad_scaler:  # fp16 goes on with its loss scale (not from fp32/bf16)
            scaler.load_state_dict(state.grad_scaler)
        self.cursor, self.step = state.resume_cursor, state.step
        self.replica_optimizers = state.replica_optimizers
        torch.set_rng_state(state.torch_rng)
        self.resumed_from = loaded.manifest.name
        self.last_loss = loaded.manifest.meta.get("loss", float("nan"))
        if self.rank == 0:
            where = (f"batch {self.cursor.batch}" if self.cursor.remaining is None else
                     f"{stream_deal.length(self.cursor.remaining)} of {self.data.stream_rows} rows of the epoch left")
            say(f"resuming from checkpoint {loaded.manifest.name} (step {self.step}, epoch {self.cursor.epoch}, "
                f"{where})")

    def result(self, status: str, verdict: Verdict | None, checkpoint: str | None) -> RunResult:
        at = self.loop if self.loop is not None else self  # where training stands now
        throughput = self.throughput
        return RunResult(status=status, attempt=self.attempt, step=at.step, epoch=at.cursor.epoch,
                         world_size=self.size, checkpoint=checkpoint, verdict=verdict, loss=at.last_loss,
                         resumed_from=self.resumed_from, skipped_checkpoints=tuple(self.skipped_checkpoints),
                         remedies=self.cfg.remedies,
                         skipped_rows=self.cfg.skip_rows,
                         samples_per_sec_after_warmup=throughput.samples_per_sec if throughput else None,
                         health_monitor_share_after_warmup=throughput.monitor_share if throughput else None,
                         checkpoint_blocked_seconds=(self.checkpointing.blocked_seconds
                                                     if self.checkpointing is not None and self.rank == 0 else None),
                         world_size_changes=tuple(self.world_size_changes),
                         membership_changes=tuple(c.as_record() for c in self.elastic.changes)
                         if self.elastic is not None else (),
                         elastic_commits=self.elastic.state.commits if self.elastic is not None else None,
                         elastic_commit_seconds=(self.elastic.state.commit_seconds if self.elastic is not None
                                                 else None))

    def replayed(self, verdict: Verdict) -> Verdict:
        """Replay the verdict's step on every rank (replay.py) and, on rank 0, add what the ranks found to its
        evidence (replay_exchange.py: through the run folder). Bounded by health.replay_seconds; whatever
        goes wrong, the verdict stands (with `replay_unavailable` saying why)."""
        limit = self.cfg.health.replay_seconds
        step = step_to_replay(verdict.evidence, self.step, limit)
        if isinstance(step, str):
            return unreplayed(verdict, step)
        started = time.monotonic()
        deadline = started + limit
        folder, alive = RunFolder(self.run_folder), self.progress.alive
        if self.guard is not None:
            # The checkpoint in flight published, then the plain verdict: a replay cut short loses nothing,
            # and the other ranks, which wait for this result, then replay on the same checkpoint as rank 0.
            self.checkpointing.settle(limit)
            self.guard.publish_result(dataclasses.replace(self.result(FAILED, verdict, None), replaying=True).to_json())
        else:
            wait_for_result(folder, self.attempt, deadline, replay_started, alive)
        report = self._replay(step, deadline)
        say(f"rank {self.rank}: replay of step {step}: " + (
            "decided nothing: " + report.error if report.nonfinite is None else
            f"non-finite again, rows {[f'{r.file}#{r.row}' for r in report.rows]}" if report.nonfinite else
            "finite") + f" ({report.tests} row tests, {report.seconds:.1f}s)")
        try:
            publish_report(folder, self.attempt, report)
            if self.rank != 0:  # stay until rank 0 has gathered: an early exit ends the job (replay_exchange.py)
                wait_for_result(folder, self.attempt, deadline + 2 * GRACE_SECONDS, gathered, alive)
                return verdict
            reports = gather_reports(folder, self.attempt, self.size, deadline + GRACE_SECONDS, alive)
        except Exception as exc:  # noqa: BLE001 - the store failed: the verdict stands without the replay
            return unreplayed(verdict, f"replay of step {step}: its reports could not be exchanged "
                                       f"({type(exc).__name__}: {exc})"[:300])
        found = replay_evidence(step, self.size, reports, time.monotonic() - started)
        line = found["replay"]["reason"] if "replay" in found else found["replay_unavailable"]
        return Verdict(verdict.status, f"{verdict.reason}. Replay: {line}", {**verdict.evidence, **found})

    def _replay(self, step: int, deadline: float) -> ReplayReport:
        """This rank's replay of `step` on the newest checkpoint before it (or the initial weights); its
        seconds count the checkpoint's read too."""
        started = time.monotonic()
        try:
            cursors = step_minibatches(step, self.step, self.cursor, self.data.micro_batches(self.cursor),
                                       self.data.batches_per_epoch, self.engine.accumulation_steps,
                                       self.cfg.epochs)
            published = self.published()
            names = [name for name in published.names() if step_of(name) < step]
            found = store_call(self.progress, "read of the checkpoint to replay on", self.run_folder,
                               lambda moved: first_loadable(names, lambda name: published.load(name, moved),
                                                            self.run_folder.uri, self._decode))
        except Exception as exc:  # noqa: BLE001 - a replay that fails decides nothing
            return ReplayReport(self.rank, step, None, None, seconds=time.monotonic() - started,
                                error=f"replay failed: {type(exc).__name__}: {exc}"[:300])
        state, checkpoint_step = (found[1].model, found[1].step) if found is not None else (None, None)
        replay = StepReplay(self._new_model, self.data, self.cfg.seed, self.engine.accumulation_steps, self.rank,
                            alive=self.progress.alive)
        report = replay.run(step, cursors, state, checkpoint_step, deadline)
        return dataclasses.replace(report, seconds=time.monotonic() - started)

    def commit(self):
        """This rank's state now, copied into memory, with what a checkpoint of it would say (an elastic
        commit: rank/elastic.py)."""
        from .commits import ROUND_META, Commit

        loop = self.loop
        commit = Commit(training_state(loop).host_copy(), self.checkpointing.meta(loop) | {ROUND_META: self.elastic.round})
        self.faults.in_commit(loop.step)
        return commit

    def let_go(self) -> None:
        """An elastic job's round ended by a change of workers: stop this round's threads (its data reader's
        read in flight abandoned). Rank 0's checkpoint upload in flight goes on: the next round waits for it
        only when its own first checkpoint falls due, not before its first step
        (ElasticRun.checkpoint_writer). The process, its liveness and its health log go on into the next
        round."""
        self.data.close()
        for callback in self.callbacks:
            if isinstance(callback, RowLog):
                callback.close()
        if self.garbage_collection is not None:
            self.garbage_collection.restore()

    def training_step(self) -> int | None:
        # None before the loop began (restoring, starting): the step is then not one of training.
        return self.loop.step + 1 if self.loop is not None else None

    def train(self) -> int:
        cfg = self.cfg
        if self.resumed_from is not None and self.cursor.epoch >= cfg.epochs:
            self.say_memory()
            return self.finish_finished()
        self.say_memory()
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


def main(cfg: JobConfig) -> int:
    if cfg.elastic is not None and engine_name(cfg, os.environ.get(ENGINE_ENV)) == DDP:
        # DDP elastic: torchrun restarts every worker, which resume from a host's copy (ddp_elastic.py)
        from .ddp_elastic import run as run_restarted

        return run_restarted(cfg, lambda cfg, engine, start, elastic: Trainer(cfg, engine, start=start,
                                                                              elastic=elastic),
                             device_memory=cuda_peak_bytes)
    if cfg.elastic is not None:  # Horovod elastic: rounds of trainers, one per membership (elastic.py)
        from .elastic import run as run_elastic

        return run_elastic(cfg, lambda cfg, engine, start, elastic: Trainer(cfg, engine, start=start, elastic=elastic))
    # The engine its launcher was chosen for (engines.ENGINE_ENV), else cfg.engine.
    return run_rank(cfg, start_engine, lambda cfg, engine, start: Trainer(cfg, engine, start=start),
                    device_memory=cuda_peak_bytes)


def cuda_peak_bytes(engine: Engine) -> int | None:
    """The most device memory this rank's CUDA allocator held (for an OOM's evidence); None off the GPU."""
    if engine.placement.cuda and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    return None
