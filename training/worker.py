"""One Horovod rank: load its partition, resume, train with health checks, checkpoint. Runs under horovodrun
or mpirun (`python -m ringflow.training CONFIG`)."""
from __future__ import annotations

import io
import json
import math
import os
import sys
import time

import torch

from ringflow.training import exit_codes, run_layout
from ringflow.training.checkpoint import CheckpointStore
from ringflow.training.config import JobConfig
from ringflow.training.data import Cursor, PartitionData
from ringflow.training.faults import FaultInjector
from ringflow.training.health.monitor import SyncHealthMonitor, gradient_norm
from ringflow.training.health.records import HealthLog, record
from ringflow.training.health.verdict import Verdict
from ringflow.training.health.watchdog import StallWatchdog
from ringflow.training.manifest import load_manifest
from ringflow.training.models import build_model
from ringflow.training.store import open_store
from ringflow.training.sync_wait import wait_for_allreduce
from ringflow.training.worker_env import ATTEMPT_ENV



def say(message: str) -> None:
    print(f"[ringflow] {message}", flush=True)


def make_optimizer(cfg: JobConfig, model: torch.nn.Module, world_size: int) -> torch.optim.Optimizer:
    # Linear scaling: the effective batch is world_size times the per-worker batch.
    lr = cfg.learning_rate * world_size
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=lr)


def serialize_state(model, optimizer, cursor: Cursor, step: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "cursor": [cursor.epoch, cursor.batch], "step": step, "torch_rng": torch.get_rng_state()}, buf)
    return buf.getvalue()


WARMUP_STEPS = 10


class Trainer:
    def __init__(self, cfg: JobConfig, hvd):
        self.cfg, self.hvd = cfg, hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        manifest, shard_store = load_manifest(cfg.manifest_uri)
        self.manifest = manifest
        self.data = PartitionData(shard_store, manifest, self.rank, self.size, cfg.batch_size)
        if self.data.batches_per_epoch == 0:
            raise ValueError(f"batch_size {cfg.batch_size} exceeds the partition's {len(self.data.x)} rows")
        torch.manual_seed(cfg.seed)
        schema = manifest.schema
        self.model, self.loss_fn = build_model(cfg.model, len(schema.features), schema.num_outputs, schema.task)
        compression = hvd.Compression.fp16 if cfg.horovod.fp16_compression else hvd.Compression.none
        # Wrap before loading any state: DistributedOptimizer builds a fresh optimizer from the param groups.
        self.optimizer = hvd.DistributedOptimizer(
            make_optimizer(cfg, self.model, self.size), named_parameters=self.model.named_parameters(),
            compression=compression, backward_passes_per_step=cfg.horovod.backward_passes_per_step)
        self.run_store = open_store(cfg.checkpoint.uri)
        self.checkpoints = CheckpointStore(self.run_store, keep_last=cfg.checkpoint.keep_last)
        self.health_log = HealthLog(self.run_store, cfg.health.flush_seconds, enabled=self.rank == 0)
        self.step, self.cursor, self.resumed_from, self.last_loss = 0, Cursor(), None, float("nan")
        self._resume()
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        # Optimizer state travels pickled, so every rank gets rank 0's exact values and types (Adam's
        # tensor `step` included), and a resumed run matches an uninterrupted one bit for bit.
        state = hvd.broadcast_object(self.optimizer.state_dict() if self.rank == 0 else None, root_rank=0,
                                     name="ringflow.optimizer_state")
        self.optimizer.load_state_dict(state)
        self.monitor = SyncHealthMonitor(hvd, cfg.health, self.health_log, cfg.batch_size)
        # Read every step: bench/health_overhead.py turns it off and on in alternate blocks of one job.
        self.monitoring = cfg.health.enabled
        self.faults = FaultInjector(cfg, self.rank)
        self.throughput: float | None = None
        self.monitor_share: float | None = None

    def _resume(self) -> None:
        # Every rank reads the checkpoint itself; the broadcast that follows makes rank 0's copy the truth.
        loaded = self.checkpoints.latest_valid()
        if loaded is None:
            return
        state = torch.load(io.BytesIO(loaded.files["state.pt"]), weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.cursor, self.step = Cursor(*state["cursor"]), state["step"]
        torch.set_rng_state(state["torch_rng"])
        self.resumed_from = loaded.manifest.name
        self.last_loss = loaded.manifest.meta.get("loss", float("nan"))
        if self.rank == 0:
            say(f"resuming from checkpoint {loaded.manifest.name} (step {self.step}, epoch {self.cursor.epoch}, "
                f"batch {self.cursor.batch})")

    def save_checkpoint(self, final: bool = False) -> str | None:
        if self.rank != 0:
            return None
        meta = {"step": self.step, "epoch": self.cursor.epoch, "cursor": [self.cursor.epoch, self.cursor.batch],
                "loss": self.last_loss, "world_size": self.size, "final": final,
                "manifest_uri": self.cfg.manifest_uri, "model": json.loads(json.dumps(self.cfg.to_dict()["model"])),
                "schema": {"num_features": len(self.manifest.schema.features),
                           "num_outputs": self.manifest.schema.num_outputs, "task": self.manifest.schema.task}}
        name = self.checkpoints.save(self.step, {"state.pt": serialize_state(
            self.model, self.optimizer, self.cursor, self.step)}, meta)
        # The records up to a checkpoint go out with it: a crash after it loses neither.
        self.health_log.flush(force=True)
        return name

    def write_result(self, status: str, verdict: Verdict | None, checkpoint: str | None) -> None:
        if self.rank != 0:
            return
        doc = {"status": status, "step": self.step, "epoch": self.cursor.epoch, "loss": self.last_loss,
               "checkpoint": checkpoint, "verdict": verdict.to_dict() if verdict else None,
               "resumed_from": self.resumed_from, "world_size": self.size,
               "attempt": os.environ.get(ATTEMPT_ENV), "samples_per_sec_after_warmup": self.throughput,
               "health_monitor_share_after_warmup": self.monitor_share}
        self.health_log.append(record("end", status=status, step=self.step), force_flush=True)
        self.run_store.put_bytes(run_layout.RESULT, json.dumps(doc, indent=1, default=str).encode())

    def stop_on(self, verdict: Verdict) -> int:
        code = exit_codes.BY_VERDICT[verdict.status]
        if self.rank == 0:
            say(f"health verdict {verdict.status}: {verdict.reason}")
            say(f"evidence: {json.dumps(dict(verdict.evidence), default=str)}")
        self.write_result("failed", verdict, None)
        return code

    def on_stall(self, seconds: float, last_step: int | None) -> None:
        stall = record("stall", rank=self.rank, last_step=last_step, seconds=seconds)
        print(f"[ringflow] rank {self.rank}: no step completed for {seconds:.0f}s after step {last_step}",
              file=sys.stderr, flush=True)
        if self.rank == 0:
            self.health_log.append(stall, force_flush=True)
            from ringflow.training.health.verdict import judge
            self.write_result("failed", judge([stall], self.cfg.health), None)
        else:
            time.sleep(5)  # give rank 0 the chance to record the verdict before the job is torn down
        os._exit(exit_codes.BY_VERDICT["STALLED"])

    def train(self) -> int:
        cfg, k = self.cfg, self.cfg.horovod.backward_passes_per_step
        if self.rank == 0:
            self.health_log.append(record("start", world_size=self.size, step=self.step,
                                          resumed_from=self.resumed_from), force_flush=True)
            say(f"training {cfg.epochs} epochs x {self.data.batches_per_epoch} batches of {cfg.batch_size} "
                f"on {self.size} workers (lr {cfg.learning_rate * self.size:g} = {cfg.learning_rate:g} x {self.size})")
        watchdog = StallWatchdog(cfg.health.stall_seconds, self.on_stall)
        watchdog.start()
        samples, window_start = 0, time.perf_counter()
        # Throughput after warm-up, and the share of that time the training thread spent in the health
        # monitor, for result.json (bench/throughput.py compares them with the peers' and with health off).
        warm_step, warm_started, warm_samples = self.step + WARMUP_STEPS, None, 0
        monitor_time, params = 0.0, list(self.model.parameters())
        last_step = cfg.epochs * self.data.batches_per_epoch // k
        first_nonfinite_step = None
        for epoch in range(self.cursor.epoch, cfg.epochs):
            start_batch = self.cursor.batch if epoch == self.cursor.epoch else 0
            step_started = time.perf_counter()
            for b, x, y in self.data.batches(cfg.seed, Cursor(epoch, start_batch)):
                self.model.train()
                loss = self.loss_fn(self.model(x), y)
                loss = self.faults.before_backward(self.step + 1, loss)
                (loss / k).backward()
                self.last_loss = float(loss.detach())
                if first_nonfinite_step is None and not math.isfinite(self.last_loss):
                    # Local and free; the next measurement gathers it, so the verdict names the rank and
                    # step where it began, not the later step where every replica had caught it.
                    first_nonfinite_step = self.step + 1
                samples += len(x)
                if (epoch * self.data.batches_per_epoch + b + 1) % k:
                    continue  # accumulate: Horovod all-reduces after the k-th backward pass
                sync_started = time.perf_counter()
                if cfg.horovod.wait == "sleep":
                    wait_for_allreduce(self.hvd, self.optimizer)
                self.optimizer.synchronize()
                sync_time = time.perf_counter() - sync_started
                self.step += 1
                step_time = time.perf_counter() - step_started
                verdict = None
                if self.monitoring and (cfg.health.nonfinite_every_step or self.monitor.wants_step(self.step)
                                        or self.step % cfg.checkpoint.every_steps == 0 or self.step == last_step):
                    monitor_started = time.perf_counter()
                    grad_norm = gradient_norm(params)
                    # The averaged gradient is the same on every rank, so every rank makes the same choice
                    # here and the allgather in on_step stays matched.
                    if self.monitor.wants_step(self.step) or not math.isfinite(grad_norm):
                        verdict = self.monitor.on_step(self.step, epoch, step_time, sync_time, self.last_loss,
                                                       grad_norm, first_nonfinite_step)
                    monitor_time += time.perf_counter() - monitor_started
                if verdict is None or not verdict.is_fatal(cfg.health.stop_on_degraded):
                    with self.optimizer.skip_synchronize():
                        self.optimizer.step()
                    self.optimizer.zero_grad()
                    self.faults.after_step(self.step, self.model)
                    if self.monitoring and self.monitor.wants_checksum(self.step):
                        monitor_started = time.perf_counter()
                        verdict = self.monitor.on_checksum(self.step, self.model)
                        monitor_time += time.perf_counter() - monitor_started
                if verdict is not None and verdict.is_fatal(cfg.health.stop_on_degraded):
                    watchdog.stop()
                    return self.stop_on(verdict)
                if self.step == warm_step:
                    warm_started, monitor_time = time.perf_counter(), 0.0
                elif warm_started is not None:
                    warm_samples += len(x) * k * self.size
                self.cursor = Cursor(epoch, b + 1) if b + 1 < self.data.batches_per_epoch else Cursor(epoch + 1, 0)
                watchdog.beat(self.step)
                if self.step % cfg.log_every_steps == 0 and self.rank == 0:
                    rate = samples * self.size / max(time.perf_counter() - window_start, 1e-9)
                    say(f"step={self.step} epoch={epoch + 1}/{cfg.epochs} loss={self.last_loss:.4f} "
                        f"samples/s={rate:.0f} sync_share={sync_time / max(step_time, 1e-9):.2f}")
                    samples, window_start = 0, time.perf_counter()
                if self.step % cfg.checkpoint.every_steps == 0:
                    self.save_checkpoint()
                self.health_log.flush()
                step_started = time.perf_counter()
        if warm_started is not None and warm_samples:
            elapsed = time.perf_counter() - warm_started
            self.throughput, self.monitor_share = warm_samples / elapsed, monitor_time / elapsed
        verdict = self.monitor.collect()  # the last measurements, still in flight
        watchdog.stop()
        if verdict is not None and verdict.is_fatal(cfg.health.stop_on_degraded):
            return self.stop_on(verdict)
        final = self.save_checkpoint(final=True)
        self.write_result("succeeded", self.monitor.last_verdict, final)
        if self.rank == 0:
            say(f"done: step {self.step}, loss {self.last_loss:.4f}, final checkpoint {final}")
        return exit_codes.OK


def start_horovod(cfg: JobConfig):
    """Initialize Horovod for this rank with the config's knobs; returns horovod.torch."""
    # Set by the rank itself: mpirun under an MPIJob starts ranks with just the variables it forwards, and
    # Horovod and Open MPI read these once, in hvd.init().
    os.environ.update(cfg.horovod.environment())
    import horovod.torch as hvd

    hvd.init()
    # Share the host's cores among the ranks on it: oversubscribed cores make every step slower.
    # RINGFLOW_TORCH_THREADS overrides (bench/throughput.py pins one core per rank to measure scaling).
    threads = os.environ.get("RINGFLOW_TORCH_THREADS")
    torch.set_num_threads(int(threads) if threads else max(1, (os.cpu_count() or 1) // hvd.local_size()))
    return hvd


def main(cfg: JobConfig) -> int:
    return Trainer(cfg, start_horovod(cfg)).train()
