"""What every engine's rank does around its own training loop, the same for torch (worker.Trainer) and
TensorFlow (tensorflow_worker.TfTrainer): open the run (its attempt, liveness, health log, manifest), and
end it (result.json, a stop on a verdict, a stall, a rerun of a finished job). Torch-free.

A subclass sets cfg, rank and size, calls `_open` first thing, and says how its attempt stands (`result`).
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..formats import exit_codes
from ..formats.config import ConfigError, JobConfig
from ..formats.manifest import ShardManifest, split_manifest_uri
from ..formats.run_folder import RunFolder
from ..formats.run_result import FAILED, SUCCEEDED, RunResult
from ..health.memory_limits import MemoryLimits
from ..health.progress import FETCH
from ..health.records import HealthLog, record
from ..health.verdict import NONFINITE, STORE_UNAVAILABLE, Verdict
from ..store import ObjectStore
from .callbacks.logging import say
from .last_word import ENDING
from .rank_start import LAST_WORD_SECONDS, RankStart, liveness_record, store_call, store_record, within


class RankRun:
    cfg: JobConfig
    rank: int
    size: int
    resumed_from: str | None
    step: int

    def _open(self, cfg: JobConfig, start: RankStart | None) -> tuple[ObjectStore, ShardManifest]:
        """Begin this rank's part of the attempt (unless main() began it before the engine's rendezvous),
        open the health log (rank 0 writes it) and read the shards' manifest: (its store, the manifest)."""
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
        if start.health_log is None or start.health_log_guard is not guard:  # kept across an elastic job's
            # changes of workers while this process's claim stands (rank/elastic.py)
            start.health_log = HealthLog(guard.store if guard else self.run_folder, cfg.health.flush_seconds,
                                         enabled=guard is not None, attempt=self.attempt,
                                         first_seq=guard.attempt.ref.first_seq if guard else 0,
                                         before_write=(lambda: guard.check(max_age=cfg.health.heartbeat_interval()))
                                         if guard else (lambda: None))
            start.health_log_guard = guard
            start.health_log.start_flushing()
        self.health_log = start.health_log
        manifest_store, manifest_key = split_manifest_uri(cfg.manifest_uri)
        self.manifest = store_call(progress, f"read of {manifest_key}", manifest_store, lambda moved:
                                              ShardManifest.from_json(manifest_store.get_bytes(manifest_key,
                                                                                               progress=moved)))
        if cfg.skip_rows and self.rank == 0:
            listed = ", ".join(f"{r.file}#{r.row}" for r in cfg.skip_rows[:10])
            say(f"skip_rows: {len(cfg.skip_rows)} row(s) never served, each epoch: {listed}"
                f"{' ...' if len(cfg.skip_rows) > 10 else ''}")
        return manifest_store, self.manifest

    def say_memory(self) -> None:
        """What memory this rank has, said once in the log as training begins: if the kernel's OOM killer ends
        the rank, nothing can be read from the dead process, and the launcher compares its cgroup's OOM kills
        with this (core/backends/processes/oom_watch.py)."""
        print(MemoryLimits.read(self.rank).line(), file=sys.stderr, flush=True)

    def training_step(self) -> int | None:
        """The step this rank is training now (the one after the last it completed): an OOM's evidence."""
        return self.step + 1

    def result(self, status: str, verdict: Verdict | None, checkpoint: str | None) -> RunResult:
        """This attempt's outcome now, the same on every rank."""
        raise NotImplementedError

    def _health_dict(self) -> dict:
        # The run's own thresholds, kept with its records: `ringflow health RUN` judges with them.
        return self.cfg.to_dict()["health"]

    def write_result(self, status: str, verdict: Verdict | None, checkpoint: str | None) -> RunResult:
        """This attempt's outcome, the same on every rank; rank 0 writes it (result.json), after the health
        records it has not yet written."""
        result = self.result(status, verdict, checkpoint)
        if self.guard is not None:
            with ENDING:
                self.health_log.append(record("end", status=status, step=result.step))
                self.health_log.close()
                self.guard.publish_result(result.to_json())
        return result

    def replayed(self, verdict: Verdict) -> Verdict:
        """The NONFINITE `verdict` with what a replay of its step found (formats/replay_report.py). Here, for
        an engine that cannot replay (TensorFlow: its model and step are Keras's), the evidence says so."""
        return unreplayed(verdict, "replay: not supported by this engine (the torch engines, horovod and ddp, "
                                   "replay a non-finite step)")

    def stop_on(self, verdict: Verdict) -> int:
        if verdict.status == NONFINITE:
            verdict = self.replayed(verdict)
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
        if "verdict" not in meta:  # every final checkpoint keeps its verdict since before the first release
            raise ValueError(f"final checkpoint {self.resumed_from} keeps no verdict: an earlier ringflow wrote it; "
                             f"start a new run (a new run_uri) and retrain")
        return Verdict.from_dict(meta["verdict"])

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


def unreplayed(verdict: Verdict, why: str) -> Verdict:
    """`verdict` with `why` no replay decided anything: the remediation policy then acts as without replays."""
    return Verdict(verdict.status, verdict.reason, {**verdict.evidence, "replay_unavailable": why})


def run_rank(cfg: JobConfig, start_engine, make_trainer, device_memory=None, begin=None) -> int:
    """A rank from its start to its exit code, for any engine: begin before the engine's rendezvous when the
    launcher names the rank, start the engine (`start_engine(cfg)`), train (`make_trainer(cfg, engine,
    start).train()`); a store that kept failing is its own verdict, and so is running out of memory (torch's
    or TensorFlow's OOM error, a MemoryError: oom_report.end_on_oom, `device_memory(engine)` the device bytes
    for its evidence). Any other exception is raised on (a traceback, exit 1). The engine's `shutdown`, if
    it has one, runs last. begin(cfg): this rank's RankStart before the engine starts (default: begin_early)."""
    from .oom_report import end_on_oom
    from ..formats.checkpoint import CheckpointOfAnotherEngine
    from .rank_start import begin_early, store_failed
    from ..health.oom import classify
    from ..store import StoreConfigError, StoreUnavailable

    started = time.monotonic()
    start = (begin or begin_early)(cfg)
    engine = start_engine(cfg)
    trainer = None
    try:
        trainer = make_trainer(cfg, engine, start)
        return trainer.train()
    except (StoreUnavailable, StoreConfigError) as exc:
        return store_failed(exc, cfg, time.monotonic() - started, engine.rank, engine.size, trainer, start)
    except (CheckpointOfAnotherEngine, ConfigError) as exc:
        # Bad input, the same on every try: one line and the config's code, which the failure policy does
        # not retry.
        print(f"[ringflow] rank {engine.rank}: {exc}", file=sys.stderr, flush=True)
        return exit_codes.CONFIG
    except Exception as exc:
        kind = classify(exc)
        if kind is None:
            raise
        return end_on_oom(exc, kind, cfg, engine, trainer, start, device_memory)
    finally:
        getattr(engine, "shutdown", lambda: None)()
