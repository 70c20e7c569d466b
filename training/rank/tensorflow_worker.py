"""One rank of a TensorFlow job: the same run folder, data order, checkpoints, health records, heartbeat and
result.json as a torch rank (worker.py), with a training loop of its own. Runs in the TF venv (no torch):
`python -m ringflow.training CONFIG` hands an engine whose launcher is "tf_config" here.

Why a custom loop and not Keras's `model.fit`: under Keras 3 (TensorFlow's default since 2.16) `fit` fails in
MultiWorkerMirroredStrategy (keras-team/keras#20585, open), and the legacy tf-keras (TF_USE_LEGACY_KERAS=1)
would be a second, deprecated Keras to pin. A loop of ours also gives the hooks the health checks need,
which `fit` hides: the averaged gradient before it is applied (a NaN/Inf one is never applied), the
all-reduce's time, the cursor after every step (sample-exact checkpoints).

    for each minibatch from the cursor on:
        out = step(x, y)     one compiled call (engines/tensorflow.compile_step): forward, backward,
                             all-reduce, the update unless the averaged gradient is NaN/Inf;
                             out = [loss, gradient norm, sync seconds], a tensor not read yet
        measure (every health.every_steps, the last step; at a checkpoint-cadence step, or every step with
                health.nonfinite_every_step, when a NaN/Inf gradient was skipped) -> stop?
        checksum (every health.checksum_every_steps) -> stop?
        cursor past this batch; heartbeat, log, throughput, checkpoint cadence

The step's outputs are read (copied to Python) only at the steps that measure or log, so the loop never
waits on a value between them: a step is one trip through Python, as in TensorFlow's own multi-worker
custom loop (bench/results/tf_vs_plain.md compares the two).

Every worker takes part in the same gathers at the same steps, so every worker reaches the same verdict.
Only worker 0 writes (health records, checkpoints, result.json), as in the torch ranks. Checkpoints are
written synchronously by worker 0 (the others wait in the next all-reduce): the torch ranks' background
writer snapshots torch tensors, and these models' states are small.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np

from ..formats import exit_codes
from ..formats.checkpoint import CheckpointStore, LoadedCheckpoint, SkippedCheckpoint
from ..formats.config import ConfigError, JobConfig
from ..formats.run_result import SUCCEEDED, RunResult
from ..health.progress import RESTORE
from ..health.records import record, step_record
from ..health.verdict import NONFINITE, HealthJudge, Verdict
from .callbacks.logging import ProgressLog, say
from .partition_batches import Cursor, PartitionBatches
from .rank_run import RankRun, run_rank
from .rank_start import RankStart, store_call
from .samples_rate import WARMUP_STEPS, job_samples_per_sec
from .step_timing import StepTiming
from .engines.tensorflow import LOSS, NORM, SYNC
from .tf_state import TfTrainingState


def parameter_checksum(arrays: list[np.ndarray]) -> float:
    """monitor.parameter_checksum's, on numpy: position weights catch swapped values a plain sum would not."""
    flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float64)
    return float(flat @ np.linspace(1.0, 2.0, flat.size, dtype=np.float64))


class TfTrainer(RankRun):
    """One TensorFlow rank's training, from its start to result.json. It is also the `loop` the shared
    callbacks see (Liveness, ProgressLog): epochs, data, engine, step, cursor, last_loss."""

    def __init__(self, cfg: JobConfig, engine, start: RankStart | None = None):
        import tensorflow as tf

        from .tf_models import build_model, parameters
        from .tf_optimizers import Optimizer

        self.cfg, self.engine, self.tf = cfg, engine, tf
        self.rank, self.size = engine.rank, engine.size
        self.epochs = cfg.epochs
        self.step, self.cursor, self.resumed_from, self.last_loss = 0, Cursor(), None, float("nan")
        self._pending = None  # the last step's outputs (a tensor) until they are read (_outputs)
        self.skipped_checkpoints: list[SkippedCheckpoint] = []
        self.final: str | None = None
        self.samples_per_sec: float | None = None
        self.monitor_share: float | None = None
        self.seconds_in_monitor = 0.0
        self.checkpoint_seconds = 0.0  # worker 0's training thread, writing checkpoints
        manifest_store, manifest = self._open(cfg, start)
        progress = self.progress
        # The same reader, order and cursor as the torch ranks (partition_batches.py), serving numpy arrays.
        self.data = PartitionBatches(manifest_store, manifest, self.rank, self.size, cfg.batch_size,
                                     progress=progress, skip_rows=cfg.skip_rows)
        if self.data.batches_per_epoch == 0:
            raise ValueError(f"batch_size {cfg.batch_size} exceeds the partition's {self.data.rows} rows")
        if self.data.uneven():
            # The torch engines weigh a partial micro-batch by its rows; this loop takes whole ones only.
            raise ValueError(f"the TensorFlow engine trains on whole micro-batches only: the shards' "
                             f"{self.data.stream_rows} training rows do not split into whole micro-batches of "
                             f"{cfg.batch_size} on {self.size} workers; run as many workers as the shard step "
                             f"wrote partitions ({manifest.num_partitions}), or use a torch engine")
        schema = manifest.schema
        self.schema = schema
        tf.random.set_seed(cfg.seed)
        self.model, self.loss_fn = build_model(cfg.model, schema.num_features, schema.num_outputs, schema.task,
                                               input_shape=schema.input_shape, seed=cfg.seed)
        self.params = parameters(self.model)
        variables = list(self.params.values())
        # Linear scaling, as the torch engines: the effective batch is world_size times the per-worker batch.
        self.optimizer = Optimizer(cfg.optimizer, self.params, cfg.learning_rate * self.size)
        progress.phase(RESTORE)
        self._resume()
        model, loss_fn, optimizer = self.model, self.loss_fn, self.optimizer

        def compute(x, y, scale):
            with tf.GradientTape() as tape:
                loss = loss_fn(model(x, training=True), y) * scale
            return loss, tape.gradient(loss, variables)

        self._step = engine.compile_step(compute, optimizer.apply)
        self._step.start_at(self.step)
        self.judge = HealthJudge(cfg.health)
        self._fed = False
        self.faults = [f for f in cfg.faults if f.rank == self.rank]
        self._fired: set[str] = set()
        self.log = ProgressLog(self.rank, self.size, cfg.log_every_steps, cfg.batch_size, cfg.learning_rate)

    # -- the step's outputs --------------------------------------------------------------------------------

    def _outputs(self) -> np.ndarray:
        """The last step's [loss, norm, sync seconds], copied to the host once, when first asked."""
        if self._pending is not None:
            self._read, self._pending = self._pending.numpy(), None
            self._last_loss = float(self._read[LOSS])
        return self._read

    @property
    def last_loss(self) -> float:
        """This worker's loss at the last step (read from the step's outputs when asked: a log line, a
        measurement, a checkpoint, the result)."""
        if self._pending is not None:
            self._outputs()
        return self._last_loss

    @last_loss.setter
    def last_loss(self, value: float) -> None:
        self._pending, self._last_loss = None, float(value)

    # -- checkpoints ---------------------------------------------------------------------------------------

    def _resume(self) -> None:
        def decode(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, TfTrainingState]:
            return loaded, TfTrainingState.from_loaded(loaded, f"{self.run_folder.uri} {loaded.manifest.name}")

        def newest_safe(moved):
            self.skipped_checkpoints = []
            # Before cfg.resume_before_step when a remedy set it: the newest checkpoint may already hold what
            # the retry must not resume into (a NaN/Inf step's neighbourhood).
            return self.published().latest_valid(progress=moved, decode=decode, skipped=self.skipped_checkpoints,
                                                  before_step=self.cfg.resume_before_step)

        found = store_call(self.progress, "read of the newest checkpoint", self.run_folder, newest_safe)
        if found is None:
            return
        loaded, state = found
        trained_on = int(loaded.manifest.meta.get("world_size", self.size))
        if trained_on != self.size:
            raise ConfigError("engine", f"checkpoint {loaded.manifest.name} was written by {trained_on} TensorFlow "
                              f"workers and this try runs {self.size}: the TensorFlow engine resumes on the same "
                              f"number of workers only", f"run {trained_on} workers, or train with a torch engine "
                              f"(horovod, ddp), which resumes on any number")
        # Every worker reads the same checkpoint: the replicas start equal again without a broadcast (the
        # replica checksum would say if they did not).
        missing = sorted(set(self.params) - set(state.model))
        if missing:
            raise ConfigError("model", f"checkpoint {loaded.manifest.name} has no {missing[0]}: it holds another "
                              "model", "train this model in a new run folder, or resume with the model it holds")
        for name, var in self.params.items():
            var.assign(state.model[name])
        self.optimizer.load(state.optimizer)
        self.cursor, self.step = Cursor(*state.cursor), state.step
        self.resumed_from = loaded.manifest.name
        self.last_loss = loaded.manifest.meta.get("loss", float("nan"))
        if self.rank == 0:
            say(f"resuming from checkpoint {loaded.manifest.name} (step {self.step}, epoch {self.cursor.epoch}, "
                f"batch {self.cursor.batch})")

    def _state(self) -> TfTrainingState:
        return TfTrainingState(model={k: v.numpy() for k, v in self.params.items()},
                               optimizer=self.optimizer.state(),
                               cursor=(self.cursor.epoch, self.cursor.batch), step=self.step)

    def _checkpoint(self, final: bool) -> Verdict | None:
        """Worker 0 writes and publishes a checkpoint of now; the others write nothing."""
        if self.guard is None:
            if final:
                from ..formats.checkpoint import checkpoint_name

                self.final = checkpoint_name(self.step)
            return None
        started = time.perf_counter()
        state = self._state()
        bad = state.nonfinite_arrays()
        if bad:
            return Verdict(NONFINITE, f"the state at step {self.step} holds NaN/Inf ({', '.join(bad[:5])}): lower "
                           "the learning rate, check the input data for NaN/Inf, or clip gradients; resume from "
                           "the last checkpoint (written before)",
                           {"step": self.step, "tensors": bad[:20], "seen_by": "the checkpoint writer"})
        schema = self.schema
        meta = {"step": self.step, "epoch": self.cursor.epoch, "cursor": [self.cursor.epoch, self.cursor.batch],
                "loss": self.last_loss, "world_size": self.size, "final": final, "engine": self.engine.name,
                "manifest_uri": self.cfg.manifest_uri, "model": json.loads(json.dumps(self.cfg.to_dict()["model"])),
                "schema": {"num_features": schema.num_features, "input_shape": list(schema.input_shape),
                           "num_outputs": schema.num_outputs, "task": schema.task}}
        if final:  # a rerun that resumes here has nothing left to measure: it carries this verdict instead
            verdict = self.verdict()
            meta["verdict"] = json.loads(json.dumps(verdict.to_dict(), default=str)) if verdict else None
        files = state.files()
        name = CheckpointStore(self.guard.store, keep_last=None).save(self.step, files, meta)
        for key in self.guard.publish_checkpoint(name, self.cfg.checkpoint.keep_last):
            self.run_folder.delete(f"{key}/MANIFEST.json")
            self.run_folder.delete_prefix(f"{key}/")
        seconds = time.perf_counter() - started
        self.checkpoint_seconds += seconds
        self._last_checkpoint = time.monotonic()
        self.health_log.append(record("checkpoint", name=name, step=self.step, final=final, waited_seconds=0.0,
                                      snapshot_seconds=seconds, write_seconds=seconds,
                                      bytes=sum(len(b) for b in files.values())))
        self.health_log.flush_soon()
        if final:
            self.final = name
        return None

    def _checkpoint_due(self) -> bool:
        """Worker 0's decision alone (it alone writes): a due step, once the time floor has passed."""
        return (self.guard is not None and self.step % self.cfg.checkpoint.cadence_steps == 0
                and time.monotonic() - self._last_checkpoint >= self.cfg.checkpoint.floor_seconds)

    # -- health --------------------------------------------------------------------------------------------

    def verdict(self) -> Verdict | None:
        return self.judge.verdict() if self._fed else None

    def _judge(self, rec: dict, force: bool = False) -> Verdict | None:
        self.health_log.append(rec, force_flush=force or bool(rec.get("nonfinite_ranks")))
        self.judge.feed([rec])
        self._fed = True
        verdict = self.judge.fatal() or (self.verdict() if self.cfg.health.stop_on_degraded else None)
        return verdict if verdict is not None and verdict.is_fatal(self.cfg.health.stop_on_degraded) else None

    def _measure(self, timing: StepTiming) -> Verdict | None:
        """Every worker's [step_time, sync_time, loss, first non-finite step] gathered into the step record
        (health/records.step_record: the torch monitor's shape), judged. Synchronous: the gather is a
        small collective of its own every health.every_steps steps. The first non-finite step is this
        worker's own loss's (kept by the step on the device); grad_norm is the measured step's averaged
        gradient's, or NaN when an earlier step's was NaN/Inf and was skipped (never applied)."""
        first_loss = self._step.first_nonfinite_loss()
        first = -1.0 if first_loss is None else float(first_loss)
        grad_norm = float(self._outputs()[NORM])
        if self._step.first_nonfinite_gradient() is not None and math.isfinite(grad_norm):
            grad_norm = float("nan")
        rows = self.engine.allgather(np.array([[timing.step_time, timing.sync_time, self.last_loss, first]]))
        meta = {"step": timing.step, "epoch": timing.epoch, "grad_norm": grad_norm}
        return self._judge(step_record(rows.tolist(), meta, self.cfg.batch_size), force=not math.isfinite(grad_norm))

    def _checksum(self) -> Verdict | None:
        local = parameter_checksum([v.numpy() for v in self.params.values()])
        sums = self.engine.allgather(np.array([[local]]))[:, 0].tolist()
        return self._judge(record("checksum", step=self.step, checksums=sums))

    def _measures(self, step: int, last_step: int) -> bool:
        """Whether this step is measured: every health.every_steps and the last step; and, when a NaN/Inf
        gradient was skipped since, any checkpoint-cadence step (before a checkpoint can be written) or,
        with health.nonfinite_every_step, any step. The skipped step is known alike on every worker (the
        averaged gradient's), so every worker decides alike and their gathers stay matched."""
        health = self.cfg.health
        if step % health.every_steps == 0 or step == last_step:
            return True
        if health.nonfinite_every_step or step % self.cfg.checkpoint.cadence_steps == 0:
            return self._timed(self._step.first_nonfinite_gradient) is not None
        return False

    def _timed(self, call):
        started = time.perf_counter()
        try:
            return call()
        finally:
            self.seconds_in_monitor += time.perf_counter() - started

    # -- faults (tests) ------------------------------------------------------------------------------------

    def _due(self, kind: str, step: int):
        for f in self.faults:
            if f.kind == kind and step >= f.step and kind not in self._fired:
                self._fired.add(kind)
                return f
        return None

    def _loss_scale(self, step: int) -> float:
        if self.faults and self._due("crash", step) is not None:
            print(f"[ringflow] fault: crash at step {step}", file=sys.stderr, flush=True)
            os._exit(exit_codes.ERROR)
        return float("nan") if self.faults and self._due("nan_gradient", step) is not None else 1.0

    # -- the loop ------------------------------------------------------------------------------------------

    def train(self) -> int:
        cfg, tf, engine = self.cfg, self.tf, self.engine
        if self.resumed_from is not None and self.cursor.epoch >= cfg.epochs:
            return self.finish_finished()
        self.say_memory()
        if self.rank == 0:
            self.health_log.append(record("start", step=self.step, world_size=self.size, engine=engine.name,
                                          device="cpu", precision=cfg.precision, resumed_from=self.resumed_from,
                                          health=self._health_dict()), force_flush=True)
        self.liveness.on_train_start(self)
        self.log.on_train_start(self)
        self._last_checkpoint = time.monotonic()  # the floor counts from the first step
        health = cfg.health
        # The loss scale as a tensor made once: 1, or NaN when a nan_gradient fault fires (_loss_scale).
        scales = {1.0: tf.constant(1.0, tf.float32)}
        warm_step, timed_from, timed_samples, monitor_at_start = self.step + WARMUP_STEPS, None, 0, 0.0
        last_step = cfg.epochs * self.data.batches_per_epoch
        stop: Verdict | None = None
        for epoch in range(self.cursor.epoch, cfg.epochs):
            start_batch = self.cursor.batch if epoch == self.cursor.epoch else 0
            step_started, samples = time.perf_counter(), 0
            for b, x, y in self.data.batches(cfg.seed, Cursor(epoch, start_batch)):
                if not len(x):  # a mean over no rows is NaN here (the torch loop takes an empty micro-batch)
                    raise ConfigError("skip_rows", f"skips every row of micro-batch {b} of epoch {epoch} on rank "
                                                   f"{self.rank}", "raise batch_size, or skip fewer rows")
                scale = self._loss_scale(self.step + 1)
                if scale not in scales:
                    scales[scale] = tf.constant(scale, tf.float32)
                self._pending = self._step(tf.constant(x), tf.constant(y), scales[scale])
                ended = time.perf_counter()
                samples += len(x)
                self.step += 1
                measure = health.enabled and self._measures(self.step, last_step)
                # Read only when wanted: by a measurement, or by rank 0's log line (NaN: not read this step).
                read = measure or (self.rank == 0 and self.step % cfg.log_every_steps == 0)
                timing = StepTiming(self.step, epoch, ended - step_started,
                                    float(self._outputs()[SYNC]) if read else math.nan, samples)
                if measure:
                    stop = self._timed(lambda: self._measure(timing))
                    if stop is not None:
                        break
                if health.enabled and self.step % health.checksum_every_steps == 0:
                    stop = self._timed(self._checksum)
                    if stop is not None:
                        break
                self.cursor = Cursor(epoch, b + 1) if b + 1 < self.data.batches_per_epoch else Cursor(epoch + 1, 0)
                self.liveness.on_step_end(self, timing)
                self.log.on_step_end(self, timing)
                if self.step == warm_step:  # every worker reaches it: the opening barrier (samples_rate.py)
                    engine.barrier()
                    timed_from, monitor_at_start = time.perf_counter(), self.seconds_in_monitor
                elif timed_from is not None:
                    timed_samples += samples
                if self._checkpoint_due():
                    stop = self._checkpoint(final=False)
                    if stop is not None:
                        break
                step_started, samples = time.perf_counter(), 0
            if stop is not None:
                break
        if stop is None and timed_from is not None and timed_samples:
            engine.barrier()  # the closing barrier: this worker's time runs until every worker is done
            elapsed = time.perf_counter() - timed_from
            self.monitor_share = (self.seconds_in_monitor - monitor_at_start) / elapsed
            rows = engine.allgather(np.array([[float(timed_samples), elapsed]]))
            self.samples_per_sec = job_samples_per_sec(rows[:, 0].tolist(), rows[:, 1].tolist())
        if stop is None:
            stop = self._checkpoint(final=True)
        if stop is not None:
            return self.stop_on(stop)
        result = self.write_result(SUCCEEDED, self.verdict(), self.final)
        self.liveness.stop()
        if self.rank == 0:
            say(f"done: step {self.step}, loss {self.last_loss:.4f}, final checkpoint {self.final}")
        return result.exit_code

    # -- how it ends (the rest is RankRun's) ---------------------------------------------------------------

    def result(self, status: str, verdict: Verdict | None, checkpoint: str | None) -> RunResult:
        return RunResult(status=status, attempt=self.attempt, step=self.step, epoch=self.cursor.epoch,
                         world_size=self.size, checkpoint=checkpoint, verdict=verdict, loss=self.last_loss,
                         resumed_from=self.resumed_from, skipped_checkpoints=tuple(self.skipped_checkpoints),
                         remedies=self.cfg.remedies, skipped_rows=self.cfg.skip_rows,
                         samples_per_sec_after_warmup=self.samples_per_sec,
                         health_monitor_share_after_warmup=self.monitor_share,
                         checkpoint_blocked_seconds=self.checkpoint_seconds if self.rank == 0 else None)


def main(cfg: JobConfig) -> int:
    # That the engine fits the config, `--engine tensorflow` included, was checked before: engine_name, in
    # `python -m ringflow.training` as in the launcher's preflight.
    from .engines.tensorflow import TensorflowEngine

    # Out of memory (ResourceExhaustedError, MemoryError) ends the rank as a torch rank's does (run_rank).
    return run_rank(cfg, TensorflowEngine.start, lambda cfg, engine, start: TfTrainer(cfg, engine, start=start))
