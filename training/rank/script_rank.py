"""One rank of a job that runs the user's own training code (the job config's `entry`) instead of ringflow's
loop. Started as every rank is (`python -m ringflow.training CONFIG` under horovodrun, torchrun, or one TF_CONFIG
worker), with the rank environment its launcher gives; the script calls `dist.init_process_group`, `hvd.init()`
or builds its MultiWorkerMirroredStrategy itself.

Before anything of the script runs: liveness and rank 0's claim of the run folder (rank_start.py), the
manifest, the code bundle checked against the sha256 the config pinned (formats/code_bundle.py), the newest
published checkpoint found. The script then runs in this process (runpy, or the `module:function` called),
with the training API (training/api.py) served by this rank's ScriptRun: its reports are steps and heartbeats,
its checkpoints go to the background, fenced writer, its NaN/Inf loss is a NONFINITE verdict. When it returns,
the last state it handed over is the final checkpoint and rank 0 writes result.json; a crash, an OOM, a stall
or a fenced attempt end as they do for ringflow's loop (rank_run.run_rank). Torch-free.
"""
from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import math
import os
import runpy
import sys
import threading
import time
from typing import Any, Mapping

from ..formats import exit_codes
from ..formats.checkpoint import CheckpointStore, LoadedCheckpoint
from ..formats.code_bundle import BundleError, fetch_bundle
from ..formats.config import ConfigError, JobConfig
from ..formats.run_result import FAILED, SUCCEEDED, RunResult
from ..health.progress import FIRST_STEP, RESTORE
from ..health.records import record, step_record
from ..health.verdict import HEALTHY, NONFINITE, HealthJudge, Verdict
from ..health.verdict_line import verdict_line
from .callbacks.logging import say
from .checkpoint_writer import AsyncCheckpointWriter, WrittenCheckpoint
from .partition_batches import Cursor, to_arrays
from .rank_run import RankRun, run_rank
from .rank_start import RankStart, store_call
from .script_context import Context
from .script_data import FORMATS, DatasetShard, default_format, open_batches
from .script_gather import gatherer
from ..formats.script_checkpoint import BUNDLE_META, EVAL_META, SCRIPT_META, STATE_FILES
from .script_state import ScriptState, load_state
from .worker_env import launcher_local_rank, launcher_rank, launcher_world_size

# How often a script that has not reported yet is marked alive: a script that never calls report() (its own
# loop, no training API) is judged by its process alone, never STALLED; from its first report on, the silence
# between two reports is judged as a step's (health.stall_seconds).
PULSE_SECONDS = 2.0


class StopRun(BaseException):
    """Raised in the script's thread by report() on a fatal verdict: a BaseException, so the script's own
    `except Exception` does not swallow it."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.reason)
        self.verdict = verdict


@dataclasses.dataclass(frozen=True)
class ScriptEngine:
    """The rank and world as the launcher named them: the script starts its own collective library."""

    name: str
    rank: int
    size: int

    @classmethod
    def start(cls, cfg: JobConfig, engine: str) -> "ScriptEngine":
        if engine == "horovod":  # the knobs ringflow's Horovod engine sets, read by the script's hvd.init()
            os.environ.update(cfg.horovod.environment())
        if engine == "tensorflow":
            use_legacy_keras(os.environ)
        return cls(engine, launcher_rank(os.environ) or 0, launcher_world_size(os.environ) or 1)


class ScriptRun(RankRun):
    """The rank's side of the training API for one script run."""

    def __init__(self, cfg: JobConfig, engine: ScriptEngine, start: RankStart | None):
        self.cfg, self.engine, self.rank, self.size = cfg, engine, engine.rank, engine.size
        self.step, self.resumed_from, self.last_loss = 0, None, math.nan
        self.metrics: dict[str, float] = {}
        self.eval_metrics: dict[str, float] | None = None
        self.final: str | None = None
        self._handed: tuple[int, Any] | None = None   # (step, state) handed last and not yet written
        self._last_handed: tuple[int, Any] | None = None  # (step, state) handed last, written or not
        self._written_step: int | None = None
        self._last_written = time.monotonic()
        self._last_report: float | None = None
        self._shard: DatasetShard | None = None
        self._lock = threading.Lock()
        self.manifest_store, self.manifest = self._open(cfg, start)
        self.progress.phase(RESTORE)
        self.checkpoint_state, self.cursor = self._find_checkpoint()
        self.judge = HealthJudge(cfg.health)
        self._gather = None
        self._faults = [f for f in cfg.faults if f.rank == self.rank]
        self.writer = (AsyncCheckpointWriter(CheckpointStore(self.guard.store, keep_last=None), self.progress,
                                             self._on_written, self._publish_checkpoint)
                       if self.guard is not None else None)
        self.code_dir: str | None = None
        self._pulsing = threading.Event()

    # -- start --------------------------------------------------------------------------------------------

    def _find_checkpoint(self) -> tuple[Any, Cursor]:
        """The newest safe published checkpoint's state (None: a fresh run) and the data cursor it saved."""
        def decode(loaded: LoadedCheckpoint) -> tuple[LoadedCheckpoint, Any]:
            names = [n for n in STATE_FILES if n in loaded.files]
            where = f"{self.run_folder.uri} {loaded.manifest.name}"
            if not names:
                raise ConfigError("entry", f"{where} is a checkpoint of ringflow's own loop (no script state)",
                                  "give the script run a run_uri of its own")
            return loaded, load_state(names[0], loaded.files[names[0]], f"{where}/{names[0]}")

        found = store_call(self.progress, "read of the newest checkpoint", self.run_folder,
                           lambda moved: self.published().latest_valid(progress=moved, decode=decode,
                                                                       before_step=self.cfg.resume_before_step))
        if found is None:
            return None, Cursor()
        loaded, state = found
        meta = loaded.manifest.meta
        self.resumed_from, self.step = loaded.manifest.name, int(meta["step"])
        self.last_loss = float(meta.get("loss", math.nan))
        self._written_step = self.step
        remaining = meta.get("remaining")
        cursor = Cursor(int(meta["epoch"]), 0, tuple(tuple(p) for p in remaining) if remaining is not None else None)
        if self.rank == 0:
            say(f"resuming the script from checkpoint {self.resumed_from} (step {self.step}, epoch {cursor.epoch})")
        return state, cursor

    def context(self) -> Context:
        device = os.environ.get("RINGFLOW_DEVICE") or "cpu"
        return Context(self.rank, self.size, launcher_local_rank(os.environ), device, self.cfg.run_uri, self.attempt,
                       self.engine.name, self.cfg, self.code_dir, self.resumed_from)

    # -- the API's calls ----------------------------------------------------------------------------------

    def dataset_shard(self, split: str = "train", fmt: str | None = None) -> DatasetShard:
        fmt = fmt or default_format()
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}: use one of {FORMATS}")
        if split != "train":
            raise ValueError(f"split {split!r}: use \"train\" (the eval split is get_eval_data())")
        if self._shard is None:
            batches = open_batches(self.manifest_store, self.manifest, self.rank, self.size, self.cfg.batch_size, fmt,
                                   self.progress)
            self._shard = DatasetShard(batches, self.cfg.seed, self.cfg.epochs, self.cursor, fmt)
        return self._shard

    def eval_data(self, fmt: str | None = None) -> tuple[Any, Any]:
        """The manifest's eval split, whole, checked against its sha256 (its bytes are read on each call)."""
        import io

        import pyarrow.parquet as pq

        entry = self.manifest.eval
        if entry is None:
            raise ValueError("the dataset's manifest has no eval split: shard it with an eval fraction > 0")
        data = store_call(self.progress, f"read of {entry.key}", self.manifest_store,
                          lambda moved: self.manifest_store.get_bytes(entry.key, progress=moved))
        entry.check(data)
        x, y = to_arrays(pq.read_table(io.BytesIO(data)), self.manifest.schema)
        fmt = fmt or default_format()
        if fmt == "torch":
            import torch

            return torch.from_numpy(x), torch.from_numpy(y)
        if fmt == "tensorflow":
            import tensorflow as tf

            return tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        return x, y

    def report(self, metrics: Mapping[str, Any], checkpoint: Any = None) -> None:
        """One step: a heartbeat, the loss checked, a health row every health.every_steps, the state handed to
        the writer when a checkpoint is due."""
        now = time.monotonic()
        self._pulsing.set()
        self.step += 1
        step = self.step
        if step == 1:
            gc.freeze()  # the script's model, optimizer and data: built, never garbage
        self.metrics = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        loss = self.metrics.get("loss", math.nan if "loss" in metrics else None)
        if loss is not None and not math.isfinite(loss) and self._shard is not None and self._shard.served_empty:
            # The mean loss of a batch of no rows (an uneven deal's last batch on this rank) is 0/0, not a
            # diverging model: not measured.
            loss = None
            self.metrics.pop("loss", None)
        self.last_loss = loss if loss is not None else self.last_loss
        self._fire_faults(step)
        self.progress.beat(step)
        interval = now - self._last_report if self._last_report is not None else 0.0
        self._last_report = now
        finite = loss is None or math.isfinite(loss)
        if self.cfg.health.enabled and (step % self.cfg.health.every_steps == 0 or not finite):
            self._measure(step, interval, loss, finite)
        if not finite:
            raise StopRun(Verdict(NONFINITE, f"the script reported a NaN/Inf loss at step {step} on rank "
                                             f"{self.rank}: lower the learning rate, check the input data for "
                                             "NaN/Inf, or clip gradients", {"step": step, "ranks": [self.rank],
                                                                            "loss": str(loss)}))
        if checkpoint is not None:
            self._hand(step, checkpoint)

    def _measure(self, step: int, interval: float, loss: float | None, finite: bool) -> None:
        row = [interval, 0.0, loss if loss is not None and finite else 0.0, -1.0 if finite else float(step)]
        if finite:
            if self._gather is None:  # made at the first finite gather, every rank at the same step
                self._gather = gatherer() or (lambda r: [r])
            rows = self._gather(row)
        else:  # a NaN rank stops now: no collective the others skip (making the gather's group is one)
            rows = [row]
        if self.guard is None:
            return
        epoch = self._shard.cursor.epoch if self._shard is not None else 0
        rec = step_record(rows, {"step": step, "epoch": epoch, "grad_norm": None}, self.cfg.batch_size)
        rec["metrics"] = self.metrics
        self.health_log.append(rec)
        self.judge.feed([rec])

    def _fire_faults(self, step: int) -> None:
        import signal

        for fault in self._faults:
            if step == fault.step and fault.kind == "crash":
                print(f"[ringflow] fault: SIGKILL at step {step}", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if step == fault.step and fault.kind == "hang":
                print(f"[ringflow] fault: hanging at step {step}", file=sys.stderr, flush=True)
                time.sleep(10**6)

    def _hand(self, step: int, state: Any) -> None:
        if self.writer is None:
            return
        self._handed = self._last_handed = (step, state)
        cadence = self.cfg.checkpoint
        since = step - (self._written_step or 0)
        if since >= cadence.cadence_steps and time.monotonic() - self._last_written >= cadence.floor_seconds:
            self._write(final=False)

    def _write(self, final: bool) -> None:
        step, state = self._handed
        self._handed = None
        cursor = self._shard.settled() if self._shard is not None else Cursor(self.cfg.epochs)
        meta = {"step": step, "epoch": cursor.epoch, "remaining": [list(p) for p in cursor.remaining]
                if cursor.remaining is not None else None, "loss": _json_float(self.last_loss), "final": final,
                "world_size": self.size, "engine": self.engine.name, "manifest_uri": self.cfg.manifest_uri,
                SCRIPT_META: self.cfg.entry.script, BUNDLE_META: self.cfg.entry.bundle_sha256, "metrics": self.metrics}
        if final:
            verdict = self.verdict()
            meta["verdict"] = json.loads(json.dumps(verdict.to_dict(), default=str))
            if self.eval_metrics is not None:
                meta[EVAL_META] = self.eval_metrics
        self._written_step, self._last_written = step, time.monotonic()
        name = self.writer.submit(step, lambda: ScriptState.of(state), meta, final=final)
        if final:
            self.final = name

    def checkpoint(self) -> Any:
        return self.checkpoint_state

    def report_eval(self, metrics: Mapping[str, Any]) -> None:
        self.eval_metrics = {k: float(v) for k, v in metrics.items() if _is_number(v)}

    # -- the writer's thread ------------------------------------------------------------------------------

    def _publish_checkpoint(self, name: str) -> None:
        for key in self.guard.publish_checkpoint(name, self.cfg.checkpoint.keep_last):
            self.run_folder.delete(f"{key}/MANIFEST.json")
            self.run_folder.delete_prefix(f"{key}/")

    def _on_written(self, written: WrittenCheckpoint) -> None:
        self.health_log.append(record("checkpoint", **dataclasses.asdict(written)))
        say(f"checkpoint {written.name} written: {written.bytes / 2**20:.1f} MiB in {written.write_seconds:.1f}s "
            "in the background")

    # -- the run ------------------------------------------------------------------------------------------

    def verdict(self) -> Verdict:
        if self.judge.started or self.judge.last_step is not None:
            return self.judge.verdict()
        return Verdict(HEALTHY, "the script reported no measured step: only its liveness and exit were watched",
                       {"reports": self.step})

    def training_step(self) -> int | None:
        return self.step + 1

    def result(self, status: str, verdict: Verdict | None, checkpoint: str | None) -> RunResult:
        epoch = self._shard.cursor.epoch if self._shard is not None else 0
        return RunResult(status=status, attempt=self.attempt, step=self.step, epoch=epoch, world_size=self.size,
                         checkpoint=checkpoint, verdict=verdict, loss=self.last_loss, resumed_from=self.resumed_from,
                         remedies=self.cfg.remedies, script=self.cfg.entry.script, metrics=self.metrics)

    def _pulse(self) -> None:
        while not self._pulsing.wait(PULSE_SECONDS):
            self.progress.alive()

    def train(self) -> int:
        entry = self.cfg.entry
        if entry.bundled:
            try:
                self.code_dir = store_call(self.progress, "read of the code bundle", self.run_folder,
                                           lambda moved: fetch_bundle(entry, self.run_folder))
            except BundleError as exc:  # before anything of it ran: one line, the config's code (never retried)
                print(f"[ringflow] rank {self.rank}: {exc}", file=sys.stderr, flush=True)
                self.liveness.stop()
                return exit_codes.CONFIG
        if self.rank == 0:
            self.health_log.append(record("start", world_size=self.size, step=self.step, resumed_from=self.resumed_from,
                                          health=self._health_dict(), script=entry.script), force_flush=True)
            say(f"running {entry.script} on {self.size} worker(s)"
                + (f" from bundle {entry.bundle_sha256[:12]}" if entry.bundled else ""))
        self.say_memory()
        self.progress.phase(FIRST_STEP)
        threading.Thread(target=self._pulse, name="ringflow-script-pulse", daemon=True).start()
        from .. import api

        api._serve(self)
        # What the rank's setup holds (torch, pyarrow, the run: ~340 k objects) is never scanned again by
        # Python's collector, which otherwise runs full scans of it at moments of its own while the script
        # trains (callbacks/garbage_collection.py says what that cost ringflow's loop); the script's own setup
        # is frozen at its first report(). The collector stays on for what the script makes.
        gc.collect()
        gc.freeze()
        try:
            exit_code = run_entry(entry, self.code_dir)
        except StopRun as stop:
            if self.rank != 0:  # its own NaN loss: rank 0 fails in the collective this rank leaves, writing no
                # result, so the verdict goes out in the log (health/verdict_line.py: the launcher and trigger read it)
                print(f"[ringflow] rank {self.rank}: health verdict {stop.verdict.status}: {stop.verdict.reason}",
                      file=sys.stderr, flush=True)
                print(verdict_line(stop.verdict), file=sys.stderr, flush=True)
            return self.stop_on(stop.verdict)
        finally:
            self._pulsing.set()
            api._serve(None)
        if exit_code:
            print(f"[ringflow] rank {self.rank}: {entry.script} exited with {exit_code}", file=sys.stderr, flush=True)
            self.liveness.stop()
            return int(exit_code)
        if self.writer is not None:
            if self._handed is None and self._last_handed is not None:
                # The last state handed over was written already, as a checkpoint the cadence made due: written
                # again (the same step) as the final one, with the run's verdict and eval metrics in its meta.
                self._handed = self._last_handed
            if self._handed is not None:
                self._write(final=True)
            self.writer.wait()
            if self.final is None and self._written_step is not None:
                self.final = self._newest_checkpoint()
        result = self.write_result(SUCCEEDED, self.verdict(), self.final)
        self.liveness.stop()
        if self.rank == 0:
            say(f"done: {entry.script} reported {self.step} step(s), final checkpoint {self.final}")
        return result.exit_code

    def _newest_checkpoint(self) -> str | None:
        names = self.published().names()  # newest first
        return names[0] if names else None


def use_legacy_keras(environ) -> None:
    """`tf.keras` as tf-keras (Keras 2) for a TensorFlow script rank, where tf-keras is installed: Keras 3's
    model.fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), tf-keras's works. Set here,
    before the script runs, because TensorFlow reads TF_USE_LEGACY_KERAS once, when it is first imported (a
    script cannot be sure none of its imports did that first); a script that imports `keras` itself still gets
    Keras 3. The environment's own value wins (TF_USE_LEGACY_KERAS=0: Keras 3's tf.keras)."""
    import importlib.util

    if importlib.util.find_spec("tf_keras") is not None:
        environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, (str, bytes))


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None


def run_entry(entry, code_dir: str | None) -> int:
    """Run the script (its exit status: 0, or what it passed to sys.exit) with its arguments as sys.argv, its
    folder first on sys.path and as the working directory for its relative paths."""
    script = os.path.join(code_dir, entry.script) if code_dir else entry.script
    argv, path, cwd = sys.argv, list(sys.path), os.getcwd()
    try:
        if entry.is_function:
            sys.argv = [entry.script, *entry.args]
            if code_dir:
                sys.path.insert(0, code_dir)
            module, function = entry.script.split(":")
            result = getattr(importlib.import_module(module), function)()
            return result if isinstance(result, int) and not isinstance(result, bool) else 0
        if not os.path.isfile(script):
            raise ConfigError("entry.script", f"{script!r} does not exist in this image",
                              "give a path inside the image, or entry.folder to ship the script with the job")
        sys.argv = [script, *entry.args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        if code_dir:
            os.chdir(code_dir)
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr, flush=True)
        return 1
    finally:
        sys.argv, sys.path[:] = argv, path
        os.chdir(cwd)


def main(cfg: JobConfig, engine: str) -> int:
    return run_rank(cfg, lambda cfg: ScriptEngine.start(cfg, engine),
                    lambda cfg, engine, start: ScriptRun(cfg, engine, start))
