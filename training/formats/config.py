"""The training job config: one JSON document, every field checked before any process starts.

Config classes are frozen dataclasses checked in __post_init__ (after Ray Train v2): a bad value fails with
a ConfigError that names the field and says what to put there instead.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Mapping

# The data-parallel engines and their facts: the one table (formats/engines.py).
from .engines import DDP, DEFAULT_ENGINE, ENGINES, HOROVOD, TENSORFLOW
from .engines import TABLE as ENGINE_TABLE

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ConfigError(ValueError):
    """A job config value is missing or wrong. `field` is the dotted path of the culprit."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(f"config field '{field}': {problem}; {fix}")


def _require(cond: bool, field: str, problem: str, fix: str) -> None:
    if not cond:
        raise ConfigError(field, problem, fix)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_int(obj: Any, name: str, field: str, minimum: int = 1) -> None:
    value = getattr(obj, name)
    _require(_is_int(value) and value >= minimum, field, f"is {value!r}", f"use a whole number >= {minimum}")


def _positive_number(obj: Any, name: str, field: str, allow_zero: bool = False) -> None:
    value = getattr(obj, name)
    ok = _is_number(value) and (value >= 0 if allow_zero else value > 0)
    _require(ok, field, f"is {value!r}", f"use a number {'>=' if allow_zero else '>'} 0")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Either the built-in MLP (`kind: "mlp"`) or a user factory `package.module:function`.

    A factory is called as factory(num_features, num_outputs, task, **kwargs) and returns
    (torch.nn.Module, loss_fn) where loss_fn(outputs, targets) -> scalar tensor.
    """

    kind: str = "mlp"
    hidden: tuple[int, ...] = (64, 64)
    dropout: float = 0.0
    factory: str | None = None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.kind in ("mlp", "custom"), "model.kind", f"is {self.kind!r}", 'use "mlp" or "custom"')
        if self.kind == "custom":
            _require(isinstance(self.factory, str) and bool(_IMPORT_PATH.match(self.factory)), "model.factory",
                     f"is {self.factory!r}", 'give an import path like "my_pkg.models:build"')
        _require(isinstance(self.hidden, (list, tuple)) and all(_is_int(h) and h > 0 for h in self.hidden),
                 "model.hidden", f"is {self.hidden!r}", "use a list of positive layer widths, e.g. [64, 64]")
        object.__setattr__(self, "hidden", tuple(self.hidden))
        _require(_is_number(self.dropout) and 0 <= self.dropout < 1, "model.dropout", f"is {self.dropout!r}",
                 "use a number in [0, 1)")


# The default cadence: a checkpoint every 50 steps, but at most one per 30 s. Steps alone would checkpoint a
# small model (2 ms steps) ten times a second, each costing the writer ~10-16 ms of CPU beside the ranks
# (bench/results/checkpoint_profile.md); time alone would let a slow step run far between checkpoints. 30 s is
# the most a kill loses by default, against a retry that starts in tens of seconds anyway.
DEFAULT_CHECKPOINT_EVERY_STEPS = 50
DEFAULT_CHECKPOINT_MIN_INTERVAL_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """How often rank 0 writes a checkpoint (under the run folder's checkpoints/) and how many it keeps.

    every_steps: a checkpoint is due every this many steps (default 50).
    min_interval_seconds: of the due steps, one is taken only when this long has passed since the last
      checkpoint (or the start), by rank 0's clock. Default: 30 s when every_steps is left unset, 0 (exactly
      every every_steps steps) when you set every_steps. The final checkpoint is always taken.
    """

    every_steps: int | None = None
    keep_last: int = 3
    min_interval_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.every_steps is not None:
            _positive_int(self, "every_steps", "checkpoint.every_steps")
        if self.min_interval_seconds is not None:
            _positive_number(self, "min_interval_seconds", "checkpoint.min_interval_seconds", allow_zero=True)
        _positive_int(self, "keep_last", "checkpoint.keep_last")

    @property
    def cadence_steps(self) -> int:
        """Every how many steps a checkpoint is due."""
        return DEFAULT_CHECKPOINT_EVERY_STEPS if self.every_steps is None else self.every_steps

    @property
    def floor_seconds(self) -> float:
        """The least time between two checkpoints (0: every due step is taken)."""
        if self.min_interval_seconds is not None:
            return float(self.min_interval_seconds)
        return DEFAULT_CHECKPOINT_MIN_INTERVAL_SECONDS if self.every_steps is None else 0.0


# Before the first step, start-up moves from phase to phase (progress.py) and every wait for the store is
# judged by the bytes it moves; between two such signs it does work it cannot measure (the rendezvous, where
# every rank waits for the others to start and import torch and Horovod; building the model; the first
# broadcast), which takes tens of seconds on a busy host. So before the first step the silence allowed is
# this, or stall_seconds if longer, however long start-up takes as a whole; so is the watcher's outside the
# job before the attempt's first heartbeat, and an elastic job's rendezvous after a worker left
# (health/verdict.stall_limit, health/liveness.starting; ElasticConfig.wait_seconds stays under it).
STARTUP_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class HealthConfig:
    """Gradient-sync health: what is measured how often, and where the verdict's lines are drawn."""

    # Every 10th step keeps the monitor under 3% of step time (bench/health_overhead.py).
    every_steps: int = 10
    checksum_every_steps: int = 50
    window_steps: int = 20
    straggler_ratio: float = 1.5
    # Below this lag (slowest rank's compute minus the others' median) a ratio is timer noise, not a straggler.
    straggler_min_lag_seconds: float = 0.005
    max_sync_share: float = 0.85
    stall_seconds: float = 120.0
    # A store operation the training thread waits for (the first window of data, a checkpoint due while the
    # previous one still uploads) that moves no byte for this long ends the job with STORE_UNAVAILABLE (not
    # STALLED); a slow store that still moves bytes is waited for (health/liveness.py).
    store_timeout_seconds: float = 300.0
    divergence_tolerance: float = 1e-5
    stop_on_degraded: bool = False
    flush_seconds: float = 1.0
    # The gradient norm is also taken before every checkpoint and at the last step, so a NaN/Inf that
    # slipped in between measurements stops the job before any checkpoint holds it. True checks every
    # step instead, so a NaN/Inf gradient is never applied, for more step time
    # (bench/results/health_overhead-every-step.md).
    nonfinite_every_step: bool = False
    # False turns off the per-step measurements (gradient norm, NaN/Inf, allgathers, checksums); the
    # stall watchdog and the heartbeat stay, since they cost nothing while steps complete.
    enabled: bool = True
    # How often rank 0 rewrites heartbeat.json (its last completed step and when), whatever the two
    # settings above say: the watcher outside the job judges a stall on it. None: heartbeat_interval().
    heartbeat_seconds: float | None = None
    # On a NaN/Inf step every rank replays that step's minibatch on the newest checkpoint (rank/replay.py) to
    # tell bad data from a transient fault; the row search and rank 0's wait for the ranks' reports stop after
    # this long. 0 turns replay off (the verdict then says so, and remediation lowers the learning rate).
    replay_seconds: float = 60.0

    # Below a quarter of stall_seconds a late heartbeat write cannot make a live job look stalled; above
    # 10 s it only costs writes (one small object per interval).
    MAX_DEFAULT_HEARTBEAT_SECONDS = 10.0

    def heartbeat_interval(self) -> float:
        if self.heartbeat_seconds is not None:
            return float(self.heartbeat_seconds)
        return min(self.stall_seconds / 4, self.MAX_DEFAULT_HEARTBEAT_SECONDS)

    def __post_init__(self) -> None:
        for name in ("every_steps", "checksum_every_steps", "window_steps"):
            _positive_int(self, name, f"health.{name}")
        _require(_is_number(self.straggler_ratio) and self.straggler_ratio > 1, "health.straggler_ratio",
                 f"is {self.straggler_ratio!r}", "use a ratio > 1 (slowest rank's compute time / median)")
        _require(_is_number(self.max_sync_share) and 0 < self.max_sync_share <= 1, "health.max_sync_share",
                 f"is {self.max_sync_share!r}", "use a fraction in (0, 1]")
        _positive_number(self, "straggler_min_lag_seconds", "health.straggler_min_lag_seconds", allow_zero=True)
        _positive_number(self, "stall_seconds", "health.stall_seconds")
        _positive_number(self, "store_timeout_seconds", "health.store_timeout_seconds")
        _positive_number(self, "divergence_tolerance", "health.divergence_tolerance")
        _positive_number(self, "flush_seconds", "health.flush_seconds")
        _positive_number(self, "replay_seconds", "health.replay_seconds", allow_zero=True)
        _require(isinstance(self.stop_on_degraded, bool), "health.stop_on_degraded",
                 f"is {self.stop_on_degraded!r}", "use true or false")
        _require(isinstance(self.nonfinite_every_step, bool), "health.nonfinite_every_step",
                 f"is {self.nonfinite_every_step!r}", "use true or false")
        _require(isinstance(self.enabled, bool), "health.enabled", f"is {self.enabled!r}", "use true or false")
        if self.heartbeat_seconds is not None:
            _positive_number(self, "heartbeat_seconds", "health.heartbeat_seconds")
            _require(self.heartbeat_seconds <= self.stall_seconds / 2, "health.heartbeat_seconds",
                     f"is {self.heartbeat_seconds!r}, not well under stall_seconds ({self.stall_seconds!r})",
                     f"use at most {self.stall_seconds / 2:g} (half of stall_seconds), or leave it out for "
                     f"{min(self.stall_seconds / 4, self.MAX_DEFAULT_HEARTBEAT_SECONDS):g}")


# Horovod's cycle time, which an elastic worker leaves unset (HorovodConfig.environment).
CYCLE_TIME_ENV = "HOROVOD_CYCLE_TIME"


@dataclasses.dataclass(frozen=True)
class HorovodConfig:
    """Horovod knobs. Defaults chosen by bench/throughput.py on a 2-core CPU machine."""

    fusion_threshold_mb: float = 64.0
    # The background thread sleeps this long between its rounds of negotiation, so every all-reduce waits for it.
    # 0.2 ms cut the all-reduce alone of the bench model's gradient from 1.1 to 0.3 ms at np=1 and to 0.6 at np=2,
    # but not the job's samples/s beyond this host's noise (bench/results/scaling_breakdown.md): Horovod's 1 ms stays.
    cycle_time_ms: float = 1.0
    fp16_compression: bool = False
    backward_passes_per_step: int = 1
    # Open MPI busy-polls while a rank waits in a collective. Each rank also runs Horovod's background
    # thread beside its training thread, so on a host whose cores the ranks fill, that polling takes CPU
    # from the other rank's backward pass; yielding gives it back (bench/results/throughput.md).
    # False leaves Open MPI's own choice (it yields only when it sees more ranks than slots).
    mpi_yield_when_idle: bool = True

    def __post_init__(self) -> None:
        _positive_number(self, "fusion_threshold_mb", "horovod.fusion_threshold_mb", allow_zero=True)
        _positive_number(self, "cycle_time_ms", "horovod.cycle_time_ms")
        _require(isinstance(self.fp16_compression, bool), "horovod.fp16_compression",
                 f"is {self.fp16_compression!r}", "use true or false")
        _positive_int(self, "backward_passes_per_step", "horovod.backward_passes_per_step")
        _require(isinstance(self.mpi_yield_when_idle, bool), "horovod.mpi_yield_when_idle",
                 f"is {self.mpi_yield_when_idle!r}", "use true or false")

    def environment(self, elastic: bool = False) -> dict[str, str]:
        """The env vars Horovod and Open MPI read at init (hvd.init); each rank sets them before it.
        elastic: without the cycle time, which Horovod 0.28.1 then keeps at its default: with both it and the
        fusion threshold set, a survivor's hvd.init() after a worker's death segfaults (tried here, 2 and 3
        workers, one SIGKILLed; either one alone re-inits), so an elastic worker also drops one it inherited."""
        env = {"HOROVOD_FUSION_THRESHOLD": str(int(self.fusion_threshold_mb * 1024 * 1024))}
        if not elastic:
            env[CYCLE_TIME_ENV] = str(self.cycle_time_ms)
        if self.mpi_yield_when_idle:
            env["OMPI_MCA_mpi_yield_when_idle"] = "1"
        return env


@dataclasses.dataclass(frozen=True)
class LocalSgdConfig:
    """Post-local SGD (engine "ddp" only): after `warmup_steps` synchronous steps each rank steps its own
    replica with its own gradients, and every `period` steps the ranks average their parameters
    (torch.distributed's PeriodicModelAverager). One all-reduce of the parameters per `period` steps instead
    of one of the gradients per step, for replicas that drift apart in between (bench/results/local_sgd.md).

    Both count optimizer steps: with ddp.backward_passes_per_step k, a step is k backward passes, so the
    ranks average every period * k passes. Each rank's optimizer state (momentum, Adam's moments) stays its
    own: only parameters are averaged.
    """

    period: int
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        _require(_is_int(self.period) and self.period >= 1, "ddp.local_sgd.period", f"is {self.period!r}",
                 "use a whole number >= 1: the ranks average their parameters every this many steps "
                 "(1 averages every step; remove ddp.local_sgd for synchronous gradient all-reduce)")
        _positive_int(self, "warmup_steps", "ddp.local_sgd.warmup_steps", minimum=0)


@dataclasses.dataclass(frozen=True)
class DdpConfig:
    """PyTorch DistributedDataParallel knobs (engine "ddp")."""

    # DDP all-reduces gradients in buckets of this size as backward fills them: the bandwidth knob, like
    # Horovod's fusion threshold. 25 MB is torch's own default.
    bucket_cap_mb: float = 25.0
    # Backward passes whose gradients add up (under DDP's no_sync) before one all-reduce and optimizer step.
    backward_passes_per_step: int = 1
    # None: synchronous gradient all-reduce every step (the default).
    local_sgd: LocalSgdConfig | None = None

    def __post_init__(self) -> None:
        _positive_number(self, "bucket_cap_mb", "ddp.bucket_cap_mb")
        _positive_int(self, "backward_passes_per_step", "ddp.backward_passes_per_step")
        _require(self.local_sgd is None or isinstance(self.local_sgd, LocalSgdConfig), "ddp.local_sgd",
                 f"is {self.local_sgd!r}", 'give an object like {"period": 4, "warmup_steps": 0}, or leave it out')


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """Recovery inside the job (engine "horovod", ringflow's own loop; rank/elastic.py; local processes or an
    MPIJob, kubernetes/mpijob.py): the job runs under Horovod's elastic mode, and when a worker dies the survivors go back to their last in-memory commit, deal
    the epoch's unseen rows among themselves and go on, without a retry. Fewer than `min_workers` left ends
    the job as before (the task's retry resumes from the last checkpoint). With engine "ddp" (rank/ddp_elastic.py)
    torchrun restarts every worker at once instead, in the same try, and they resume from the newest copy of the
    state a host keeps on its memory disk (written every commit_every_steps steps) or the store's newest
    checkpoint, whichever is newer; rejoin_seconds, wait_seconds and rendezvous_timeout_seconds are Horovod's only, and so
    is peer_timeout_seconds, but for a stopped worker process (below).

    min_workers: the fewest workers the job trains on. max_workers: the most (a worker that comes back, or a
    new slot, joins up to it); None: the launch's worker count. commit_every_steps: every this many steps each
    rank copies the training state into its own memory (model, optimizer, the global cursor, the step): what
    the survivors go back to, so what a death costs at most in steps redone. rejoin_seconds: how long a slot
    whose worker died stays out before a new worker is started on it (Horovod's blacklist cooldown); None:
    never (the job goes on with the survivors). peer_timeout_seconds: how long a collective waits on a silent
    peer process before it fails (Gloo's; Horovod's default is 30 s): a worker whose peer died notices at once
    only when it was talking to that peer; the others wait this long, so it bounds the recovery. Only a peer
    process that answers nothing counts: a rank whose training thread lags (a slow step, a hang) keeps its
    Horovod background thread talking, and a hang is the stall watchdog's (rank/elastic.py). One message's
    transfer must fit in it too (a fused gradient buffer, up to HOROVOD_FUSION_THRESHOLD; a piece of an object
    broadcast, horovod_objects.CHUNK_BYTES): raise it where a slow link between hosts carries a big model. It
    needs the Horovod that docker/build-horovod.sh builds (its gloo-op-timeout patch: stock Horovod bounds
    collectives and the rendezvous with one timeout, and then rendezvous_timeout_seconds bounds both; the rank
    says so in its log). A worker process the kernel reports stopped (SIGSTOP) this long, with either engine, is killed by
    the launcher, so that the job goes on without it (backends/processes/frozen_watch.py).
    rendezvous_timeout_seconds: how long the workers of a new round wait in Gloo's rendezvous for each other,
    for a joining worker still importing torch above all (3 s failed such a join on a loaded 2-core host,
    docs/guides/reliability.md). wait_seconds: how long the job waits, with fewer than min_workers left, for workers
    to come back (a rejoin, a new slot) before it ends and the task's retry takes over (Horovod's elastic
    timeout; its default is 600 s: fewer than min_workers is the retry's business, soon). It and
    rendezvous_timeout_seconds stay under the silence allowed in a rendezvous (health.stall_seconds, or
    STARTUP_SECONDS if longer), or the wait would end in a stall verdict instead of its own reason (JobConfig's check).
    """

    min_workers: int = 1
    max_workers: int | None = None
    commit_every_steps: int = 50
    rejoin_seconds: float | None = None
    peer_timeout_seconds: float = 3.0
    wait_seconds: float = 45.0
    rendezvous_timeout_seconds: float = 30.0

    def __post_init__(self) -> None:
        _positive_int(self, "min_workers", "elastic.min_workers")
        if self.max_workers is not None:
            _positive_int(self, "max_workers", "elastic.max_workers")
            _require(self.max_workers >= self.min_workers, "elastic.max_workers",
                     f"is {self.max_workers}, below min_workers {self.min_workers}",
                     "give max_workers >= min_workers (or leave it out: the launch's worker count)")
        _positive_int(self, "commit_every_steps", "elastic.commit_every_steps")
        if self.rejoin_seconds is not None:
            _positive_number(self, "rejoin_seconds", "elastic.rejoin_seconds")
        _positive_number(self, "peer_timeout_seconds", "elastic.peer_timeout_seconds")
        _require(self.peer_timeout_seconds >= 0.1, "elastic.peer_timeout_seconds", f"is {self.peer_timeout_seconds:g} s",
                 "use at least 0.1 s: a collective's wait on a live peer takes a few milliseconds, its messages more")
        _positive_number(self, "wait_seconds", "elastic.wait_seconds")
        _positive_number(self, "rendezvous_timeout_seconds", "elastic.rendezvous_timeout_seconds")

    def environment(self) -> dict[str, str]:
        """What every worker sets before hvd.init(): Gloo's rendezvous timeout (whole seconds, as Horovod reads
        it) and, through docker/build-horovod.sh's patch, its collectives' own."""
        return {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, math.ceil(self.rendezvous_timeout_seconds))),
                "HOROVOD_GLOO_OP_TIMEOUT_SECONDS": f"{self.peer_timeout_seconds:g}"}

    def bounds(self, num_workers: int) -> tuple[int, int]:
        """(fewest, most) workers of a launch of `num_workers`."""
        return self.min_workers, self.max_workers if self.max_workers is not None else num_workers

    @classmethod
    def from_dict(cls, doc: Any) -> "ElasticConfig":
        """The config's `elastic` section alone, checked as JobConfig checks it (for a launcher that reads no
        other section: kubernetes/mpijob.py)."""
        _require(isinstance(doc, Mapping), "elastic", f"is a {type(doc).__name__}", "give a JSON object")
        return _build(cls, doc, "elastic.")


# The collective implementations TensorFlow offers on CPUs (tf.distribute.experimental.CommunicationImplementation):
# "ring" (gRPC ring all-reduce) or "auto" (TensorFlow picks: ring on CPUs, NCCL on GPUs).
TF_COMMUNICATIONS = ("ring", "auto")


@dataclasses.dataclass(frozen=True)
class TensorflowConfig:
    """TensorFlow MultiWorkerMirroredStrategy knobs (engine "tensorflow")."""

    # "ring" by default: on CPUs "auto" resolves to it anyway; naming it keeps a GPU host from switching a
    # job to NCCL behind its back (ringflow's TensorFlow ranks are CPU-only: tensorflow-cpu).
    communication: str = "ring"

    def __post_init__(self) -> None:
        _require(self.communication in TF_COMMUNICATIONS, "tensorflow.communication", f"is {self.communication!r}",
                 f"use one of {TF_COMMUNICATIONS}")


# The faults the TensorFlow engine's ranks inject (rank/tensorflow_worker.py); the torch ranks have them all.
TF_FAULTS = ("nan_gradient", "crash")


def check_engine_fits(cfg: "JobConfig", engine: str) -> None:
    """ConfigError unless `engine` can run `cfg` as it is. Checked by the config for its own `engine`, and by
    the launch (rank/engines.engine_name) for `--engine`/$RINGFLOW_ENGINE, which the config never saw:
    - ddp.local_sgd runs under DDP only: Horovod's DistributedOptimizer all-reduces every step (it has no
      periodic averaging) and TensorFlow's strategy has none either; and not in fp16 (each rank's GradScaler
      would skip its own overflowing steps, so the ranks' averaging steps, counted in optimizer steps, would
      fall out of line and their all-reduces pair up wrongly);
    - TensorFlow's ranks train in fp32 on CPUs (tensorflow-cpu) and inject only TF_FAULTS."""
    others = " or ".join(f'"{name}"' for name in ENGINES if name != engine)
    if cfg.ddp.local_sgd is not None:
        _require(engine == DDP, "ddp.local_sgd", f"is set, but the engine is {engine!r}",
                 f'use "engine": "{DDP}" (or --engine {DDP}) for post-local SGD, or remove ddp.local_sgd to train '
                 "synchronously")
        _require(cfg.precision != "fp16", "ddp.local_sgd", 'is set with "precision": "fp16"',
                 'use "bf16" or "fp32" with local SGD (fp16\'s loss scaling skips steps on each rank alone, which '
                 "would put the ranks' averaging steps out of line), or remove ddp.local_sgd")
    if cfg.elastic is not None:
        _require(engine in (HOROVOD, DDP), "elastic", f"is set, but the engine is {engine!r}",
                 f'use "engine": "{HOROVOD}" (Horovod elastic) or "{DDP}" (torchrun\'s restart from a peer copy) for '
                 "recovery inside the job, or remove elastic: under TensorFlow a worker's death ends the job and the "
                 "retry resumes from the last checkpoint")
        _require(engine != DDP or cfg.ddp.local_sgd is None, "elastic", "is set with ddp.local_sgd",
                 "remove one of them: a DDP restart resumes from one host's copy of the state, and under local SGD "
                 "each rank's optimizer state is its own")
        _require(cfg.entry is None, "elastic", "is set with an entry script",
                 "remove elastic: recovery inside the job runs ringflow's own loop (a script's own Horovod elastic "
                 "code runs as it is under entry)")
        # The survivors wait for workers in a rendezvous, which the watchdogs judge as start-up: a wait as long as
        # that allowance would end in a stall verdict instead of the launcher's own reason.
        allowed = max(cfg.health.stall_seconds, STARTUP_SECONDS)
        for field in ("wait_seconds", "rendezvous_timeout_seconds"):
            seconds = getattr(cfg.elastic, field)
            _require(engine != HOROVOD or seconds < allowed, f"elastic.{field}",
                     f"is {seconds:g} s, not under the {allowed:g} s a worker may wait in a rendezvous "
                     f"before it is judged stalled (health.stall_seconds, or {STARTUP_SECONDS:g} s if longer)",
                     f"use less than {allowed:g} s, or raise health.stall_seconds above it")
    if engine == TENSORFLOW:
        _require(cfg.precision == "fp32", "precision", f'is {cfg.precision!r} with engine "{TENSORFLOW}"',
                 f'use "fp32": the TensorFlow engine trains in fp32 on CPUs, or use engine {others} for bf16/fp16')
        for fault in cfg.faults:
            _require(fault.kind in TF_FAULTS, "faults[].kind", f'is {fault.kind!r} with engine "{TENSORFLOW}"',
                     f"use one of {TF_FAULTS} with the TensorFlow engine, or engine {others}")


@dataclasses.dataclass(frozen=True)
class FaultConfig:
    """Fault injection for tests only: each fault fires on `rank` once `step` is reached, on the task's try
    `on_try` (the loop of tries keeps only that try's faults, core/try_plan.py: one run can walk a chain of
    faults, a different one on each try; the first try when not given; a single `ringflow train` runs all
    given). `seconds`: how long a slow_rank fault sleeps each step before backward (compute: a straggler), and
    a slow_sync fault inside the step's all-reduce wait (what health counts as sync, as a slow network would;
    give it on every rank: health judges the smallest share across ranks). `oom` raises the engine's
    out-of-memory error when the per-worker batch is above `above_batch`, as a rank whose activations no longer
    fit would (a smaller batch then trains: the OOM remedy's test). `crash` SIGKILLs the rank before the
    step's backward; `stop` SIGSTOPs it there (frozen, every thread: the launcher's FrozenWatch);
    `crash_in_commit` inside an elastic job's commit of the step (its state copied, before the collective check
    for changed hosts: rank/elastic.py); `crash_in_upload` (rank 0) from the
    checkpoint writer's thread once the first bytes of the step's checkpoint are written, before its
    MANIFEST; `slow_upload` (rank 0) holds that thread there `seconds`, once (a checkpoint still uploading
    when something else happens)."""

    kind: str
    rank: int = 0
    step: int = 1
    seconds: float = 0.0
    on_try: int = 1
    above_batch: int = 0

    KINDS = ("nan_gradient", "slow_rank", "slow_sync", "perturb_replica", "hang", "stop", "crash",
             "crash_in_commit", "crash_in_upload", "slow_upload", "oom")

    def __post_init__(self) -> None:
        _require(self.kind in self.KINDS, "faults[].kind", f"is {self.kind!r}", f"use one of {self.KINDS}")
        _positive_int(self, "rank", "faults[].rank", minimum=0)
        _positive_int(self, "step", "faults[].step")
        _positive_number(self, "seconds", "faults[].seconds", allow_zero=True)
        _positive_int(self, "on_try", "faults[].on_try")
        _positive_int(self, "above_batch", "faults[].above_batch", minimum=0)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True)
class EntryConfig:
    """The user's own training code, run on every rank instead of ringflow's loop (rank/script_rank.py).

    script: a `.py` file (relative to `folder`, or a path inside the image when no folder is given), or an
      import path `package.module:function` (called with no arguments; `args` are its sys.argv[1:]).
    args: the script's command-line arguments.
    folder: the script's folder on the machine that launches the job (the operator's, `ringflow train`'s):
      packed there into a bundle in the run folder, whose sha256 is pinned here (bundle_sha256) before any
      rank starts (formats/code_bundle.py). Never in a config a rank receives.
    bundle_sha256: set by the launch, never by hand: the sha256 of the bundle every rank checks before it runs
      anything (a planted or swapped bundle is refused).
    """

    script: str
    args: tuple[str, ...] = ()
    folder: str | None = None
    bundle_sha256: str | None = None

    def __post_init__(self) -> None:
        _require(isinstance(self.script, str) and bool(self.script.strip()), "entry.script", f"is {self.script!r}",
                 'give a script path like "train.py" or an import path like "my_pkg.train:main"')
        _require(self.script.endswith(".py") or bool(_IMPORT_PATH.match(self.script)), "entry.script",
                 f"is {self.script!r}", 'give a .py file ("train.py") or an import path ("my_pkg.train:main")')
        _require(isinstance(self.args, (list, tuple)) and all(isinstance(a, str) for a in self.args), "entry.args",
                 f"is {self.args!r}", 'give a list of strings, e.g. ["--epochs", "3"]')
        object.__setattr__(self, "args", tuple(self.args))
        _require(self.folder is None or (isinstance(self.folder, str) and bool(self.folder)), "entry.folder",
                 f"is {self.folder!r}", "give the folder holding the script, or leave it out (a path in the image)")
        _require(self.bundle_sha256 is None or (isinstance(self.bundle_sha256, str)
                                                and bool(_SHA256.match(self.bundle_sha256))),
                 "entry.bundle_sha256", f"is {self.bundle_sha256!r}",
                 "leave it out: the launch pins it (64 lowercase hex digits)")
        _require(self.folder is None or self.bundle_sha256 is None, "entry", "has both folder and bundle_sha256",
                 "give the folder only; the launch packs it and pins its bundle")
        if self.folder is not None or self.bundle_sha256 is not None:
            _require(self.script.endswith(".py") and not os.path.isabs(self.script)
                     and ".." not in self.script.split("/"), "entry.script",
                     f"is {self.script!r} with a folder", "give the script's path inside the folder, e.g. \"train.py\"")

    @property
    def bundled(self) -> bool:
        """Whether the code comes from a bundle in the run folder (else from the image)."""
        return self.folder is not None or self.bundle_sha256 is not None

    @property
    def is_function(self) -> bool:
        return not self.script.endswith(".py")


# The faults a user's script can be given: they fire in the training API's report() at their step.
SCRIPT_FAULTS = ("crash", "hang")


# What a remedy the operator applied (training/core/remediation.py's Remedy) says in the config the ranks get,
# and so in their result: the try it was applied on, the verdict it answers, the remedy and why.
APPLIED_REMEDY_FIELDS = ("try", "verdict", "remedy", "words")


def _check_applied_remedy(doc: Any) -> dict[str, Any]:
    _require(isinstance(doc, Mapping) and all(k in doc for k in APPLIED_REMEDY_FIELDS), "remedies[]",
             f"is {doc!r}", f"give objects with {APPLIED_REMEDY_FIELDS} (the operator writes them; leave "
                            "remedies out of job_config)")
    return json.loads(json.dumps(dict(doc)))


@dataclasses.dataclass(frozen=True)
class RowRef:
    """One row of the training data: the partition file (its manifest key) and the row's number in that file
    (0-based, file order). What a NONFINITE verdict's replay names (evidence.replay.rows) and `skip_rows` takes."""

    file: str
    row: int

    def __post_init__(self) -> None:
        _require(isinstance(self.file, str) and bool(self.file), "skip_rows[].file", f"is {self.file!r}",
                 "use the partition key the NONFINITE verdict's evidence.replay.rows names (e.g. "
                 '"part-00001.parquet")')
        _positive_int(self, "row", "skip_rows[].row", minimum=0)


OPTIMIZERS = ("sgd", "adam")
# The numeric precision of forward and backward (training/rank/devices.py): fp32 everywhere, or autocast to
# bfloat16 (CPU or GPU) or float16 (GPU only: its loss scaling, torch.amp.GradScaler, is CUDA's).
PRECISIONS = ("fp32", "bf16", "fp16")
# Whether each rank binds itself (all its threads) to its own share of the CPUs it may use (training/rank/cores.py):
# "auto" where the job was given CPUs of its own (not on a whole host other work shares, where bound ranks
# ran slower), true wherever each rank can have a CPU, false never.
BIND_CORES_AUTO = "auto"
BIND_CORES = (BIND_CORES_AUTO, True, False)
DEFAULT_BIND_CORES = BIND_CORES_AUTO
# Whether a retry changes the job after a health verdict (training/core/remediation.py): "off" reruns it as
# it was; "auto" applies the remediation policy's change (a lower learning rate, wider all-reduce buckets, a
# smaller per-worker batch, ...). Off by default: a change to the training is the owner's to opt into. The
# loop of tries applies it (core/attempts.py, for the train operator and `ringflow train --retries`); `remedies`
# then lists what was applied.
REMEDIATION_OFF, REMEDIATION_AUTO = "off", "auto"
REMEDIATIONS = (REMEDIATION_OFF, REMEDIATION_AUTO)


def is_bind_cores(value: Any) -> bool:
    # By type too: 1 == True, and a JSON 1 or "true" is a typo to report, not a choice.
    return value == BIND_CORES_AUTO or isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class JobConfig:
    manifest_uri: str
    run_uri: str  # the run folder: checkpoints/, health.jsonl, result.json (run_layout.py)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    epochs: int = 5
    batch_size: int = 32
    learning_rate: float = 0.01
    optimizer: str = "adam"
    seed: int = 0
    log_every_steps: int = 10
    # Python's cyclic garbage collector runs every this many steps, the same step on every rank, and not on
    # its own (training/rank/callbacks/garbage_collection.py); 0: Python's automatic collector.
    gc_every_steps: int = 100
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    engine: str = DEFAULT_ENGINE
    horovod: HorovodConfig = dataclasses.field(default_factory=HorovodConfig)
    ddp: DdpConfig = dataclasses.field(default_factory=DdpConfig)
    tensorflow: TensorflowConfig = dataclasses.field(default_factory=TensorflowConfig)
    precision: str = "fp32"
    bind_cores: str | bool = DEFAULT_BIND_CORES
    faults: tuple[FaultConfig, ...] = ()
    remediation: str = REMEDIATION_OFF
    # A folder on each worker's machine where every rank logs the rows of each micro-batch it trains on
    # (training/rank/callbacks/row_log.py: an audit of the data order); "": off.
    row_log_dir: str = ""
    # Set by the loop of tries under "auto" (core/try_plan.py), never by hand: resume from the newest
    # checkpoint before this step (None: the newest), and the remedies applied so far, oldest first, which
    # the ranks copy into their result.
    resume_before_step: int | None = None
    remedies: tuple[Mapping[str, Any], ...] = ()
    # Rows the reader never serves (rank/partition_batches.py), e.g. the rows a NONFINITE verdict's replay
    # named as giving a non-finite loss or gradient alone.
    skip_rows: tuple[RowRef, ...] = ()
    # The user's own training code (EntryConfig), run on every rank instead of ringflow's loop; None: ringflow's.
    entry: EntryConfig | None = None
    # Recovery inside the job (Horovod elastic): see ElasticConfig. None: a worker's death ends the job.
    elastic: ElasticConfig | None = None

    def __post_init__(self) -> None:
        _require(isinstance(self.manifest_uri, str) and self.manifest_uri.endswith(".json"), "manifest_uri",
                 f"is {self.manifest_uri!r}", "point it at the shard step's manifest.json (path or URI)")
        _require(isinstance(self.run_uri, str) and bool(self.run_uri), "run_uri", f"is {self.run_uri!r}",
                 "give a folder path, file:// or s3://bucket/prefix URI for the run")
        _positive_int(self, "epochs", "epochs")
        _positive_int(self, "batch_size", "batch_size")
        _positive_number(self, "learning_rate", "learning_rate")
        _require(self.optimizer in OPTIMIZERS, "optimizer", f"is {self.optimizer!r}", f"use one of {OPTIMIZERS}")
        _positive_int(self, "seed", "seed", minimum=0)
        _positive_int(self, "log_every_steps", "log_every_steps")
        _positive_int(self, "gc_every_steps", "gc_every_steps", minimum=0)
        _require(self.engine in ENGINES, "engine", f"is {self.engine!r}",
                 "use " + " or ".join(f'"{e.name}" ({e.launcher}/{e.pod_launcher})' for e in ENGINE_TABLE.values()))
        _require(self.precision in PRECISIONS, "precision", f"is {self.precision!r}",
                 'use "fp32" (default), "bf16" (autocast to bfloat16, on CPU or a GPU) or "fp16" (autocast to '
                 'float16 with loss scaling, GPU only)')
        _require(is_bind_cores(self.bind_cores), "bind_cores",
                 f"is {self.bind_cores!r}", 'use "auto" (default: bind where the job was given CPUs of its own), '
                 'true (bind wherever every rank can have a CPU) or false (never bind)')
        _require(self.remediation in REMEDIATIONS, "remediation", f"is {self.remediation!r}",
                 'use "off" (default: a retry reruns the job unchanged) or "auto" (a retry after a health '
                 'verdict applies the remediation policy\'s change, docs/guides/job-config.md)')
        _require(isinstance(self.row_log_dir, str), "row_log_dir", f"is {self.row_log_dir!r}",
                 'give a local folder path, or "" (off)')
        if self.resume_before_step is not None:
            _positive_int(self, "resume_before_step", "resume_before_step")
        _require(isinstance(self.remedies, (tuple, list)), "remedies", f"is {self.remedies!r}",
                 "give a list of applied remedies (the operator writes it), or leave it out")
        object.__setattr__(self, "remedies", tuple(_check_applied_remedy(r) for r in self.remedies))
        _require(isinstance(self.skip_rows, tuple) and all(isinstance(r, RowRef) for r in self.skip_rows),
                 "skip_rows", f"is {self.skip_rows!r}", 'give a list of {"file": <partition key>, "row": <n>}')
        repeated = [r for i, r in enumerate(self.skip_rows) if r in self.skip_rows[:i]]
        _require(not repeated, "skip_rows", f"lists {repeated[0] if repeated else None} more than once",
                 "list each row once")
        check_engine_fits(self, self.engine)
        if self.entry is not None:
            for fault in self.faults:
                _require(fault.kind in SCRIPT_FAULTS, "faults[].kind", f"is {fault.kind!r} with an entry script",
                         f"use one of {SCRIPT_FAULTS} (they fire at a report() step): the others act inside "
                         "ringflow's own loop")

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "JobConfig":
        _require(isinstance(doc, Mapping), "<root>", f"is a {type(doc).__name__}", "give a JSON object")
        return _build(cls, doc, "")


# The sections that are objects of their own: (the class holding one, its field) -> its class.
_NESTED = {(JobConfig, "checkpoint"): CheckpointConfig, (JobConfig, "model"): ModelConfig,
           (JobConfig, "health"): HealthConfig, (JobConfig, "horovod"): HorovodConfig, (JobConfig, "ddp"): DdpConfig,
           (JobConfig, "tensorflow"): TensorflowConfig, (DdpConfig, "local_sgd"): LocalSgdConfig,
           (JobConfig, "entry"): EntryConfig, (JobConfig, "elastic"): ElasticConfig}
# Of them, those whose null means "off".
_OPTIONAL = {(DdpConfig, "local_sgd"), (JobConfig, "entry"), (JobConfig, "elastic")}


def _build(cls: type, doc: Mapping[str, Any], path: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise ConfigError(f"{path}{unknown[0]}", "is not a known field",
                          f"remove it or use one of {sorted(fields)}")
    missing = [n for n, f in fields.items() if n not in doc
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path}{missing[0]}", "is missing", "add it (docs/reference/config.md lists every field)")
    kwargs: dict[str, Any] = {}
    for name, value in doc.items():
        nested = _NESTED.get((cls, name))
        if nested is not None and not (value is None and (cls, name) in _OPTIONAL):
            _require(isinstance(value, Mapping), f"{path}{name}", f"is a {type(value).__name__}",
                     "give a JSON object")
            value = _build(nested, value, f"{path}{name}.")
        elif cls is JobConfig and name == "faults":
            _require(isinstance(value, list), name, "is not a list", "give a list of fault objects")
            value = tuple(_build(FaultConfig, f, "faults[].") for f in value)
        elif cls is JobConfig and name == "skip_rows":
            _require(isinstance(value, list) and all(isinstance(r, Mapping) for r in value), name,
                     f"is {value!r}", 'give a list of {"file": <partition key>, "row": <n>} objects')
            value = tuple(_build(RowRef, r, "skip_rows[].") for r in value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a value of a type the checks could not even compare
        raise ConfigError(path.rstrip(".") or "<root>", str(exc), "check the value types") from exc


def load_job_config(source: str) -> JobConfig:
    """Read a config from a JSON file path or a file:// / s3:// URI."""
    if source.startswith("s3://"):
        from ..store import open_store, split_uri

        parent, name = split_uri(source)
        text = open_store(parent).get_bytes(name).decode()
    else:
        path = source[len("file://"):] if source.startswith("file://") else source
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError("<file>", f"cannot read {source!r} ({exc.strerror})", "give an existing JSON file") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("<file>", f"{source!r} is not valid JSON ({exc})", "fix the JSON syntax") from exc
    return JobConfig.from_dict(doc)
