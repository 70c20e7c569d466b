"""What the next try of a training job changes after a health verdict (`remediation: "auto"`). Pure: the
same verdict, config and history always give the same `Remedy`. Table-tested
(tests/training/core/test_remediation.py, docs/guides/job-config.md).

    NONFINITE          with the rank's replay (evidence "replay", rank side): reproducible -> resume before the
                       step with the replayed minibatch's rows skipped (config "skip_rows"; at most three times),
                       not reproducible (a transient fault) -> resume before the step, unchanged (at most twice);
                       without replay evidence: resume from the newest checkpoint before the first non-finite
                       step, with the learning rate halved; at most twice
    DEGRADED sync      a larger Horovod fusion threshold / DDP bucket (doubled, at most twice), then fp16
                       gradient compression (Horovod)
    DEGRADED straggler on Kubernetes: keep the next try off that rank's node (at most two nodes)
    STORE_UNAVAILABLE  wait, then retry: the wait doubles with each such retry, up to a cap
    OOM                the OOM advice that keeps the global batch: a smaller per-worker batch with more
                       backward passes per step; at most twice
    anything else      nothing to change (STALLED, FENCED, no verdict: the failure policy decides alone)

Every rung is bounded because a remedy that did not help the first times will not the next: the retries
are better spent failing with the evidence a person needs. A Remedy says one of three things (`action`):
CHANGE (the next try runs with `settings` applied, and where given resumes before `resume_before_step`,
avoids `avoid_nodes`, or starts after `wait_seconds`), AS_IS (this policy has nothing to change; the
failure policy's decision stands) or GIVE_UP (the verdict has remedies but none is left or none applies:
the next try would meet the same failure, so the task fails).

How it is wired (core/attempts.py, for the train operator and `ringflow train --retries`): when a try fails,
`next_try` calls `remedy` with the verdict the failure policy decided on, the config that try ran with and the
remedies of earlier tries (`remedies.jsonl` in the run folder, `PlannedRemedy` a line), and the failure
policy's `remediated` turns the decision into a retry (CHANGE) or a failure without retry (GIVE_UP). A CHANGE
is appended to remedies.jsonl for the next try, whose config `plan_try` builds with `apply_remedies` (every
earlier change, this try's resume step, and what the ranks copy into their result); the try keeps off
`avoided_nodes`, and waits `wait_seconds` first (the operator deferred, holding no worker slot).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ..formats.config import APPLIED_REMEDY_FIELDS, REMEDIATION_AUTO, JobConfig
from ..formats.engines import MPIJOB, TRAINJOB, engine_spec
from ..health.oom_advice import ACCUMULATE, JobShape, advise
from ..health.verdict import (DEGRADED, NONFINITE, OOM, STORE_UNAVAILABLE, STRAGGLER, SYNC_BOUND,
                              Verdict)
from .choices import Choice



class RemedyAction(Choice):
    """What a Remedy says of the next try (the module's docstring)."""

    CHANGE = "change"
    AS_IS = "as_is"
    GIVE_UP = "give_up"


class RemedyName(Choice):
    """The remedies, one a rung of a verdict's ladder."""

    LOWER_LEARNING_RATE = "lower_learning_rate"
    WIDER_BUCKETS = "wider_buckets"
    COMPRESS_GRADIENTS = "compress_gradients"
    AVOID_NODE = "avoid_node"
    WAIT_FOR_STORE = "wait_for_store"
    SMALLER_BATCH = "smaller_batch"
    SKIP_ROWS = "skip_rows"
    PLAIN_RETRY = "plain_retry"


# NaN/Inf again after the learning rate was halved twice (a quarter of the owner's) is the data or the
# model, not the step size: lowering it further would only train slower into the same NaN.
LEARNING_RATE_FACTOR = 0.5
MAX_LEARNING_RATE_CUTS = 2
# A replay that reproduces the NaN names the rows: skipping them is exact. A fourth minibatch of bad rows
# says the data set needs cleaning, not the run.
MAX_ROW_SKIPS = 3
# A replay that does not reproduce it is a transient fault (hardware, a race): retried as it was, twice; a
# third is a machine that keeps failing.
MAX_PLAIN_RETRIES = 2
# The config key a reproducible replay's rows go to (the rank's reader skips them; rank side).
SKIP_ROWS_SETTING = "skip_rows"
# Each doubling of the fusion threshold / bucket halves the number of all-reduces per step; past two
# (4x) the per-call latency is no longer what the step waits for, the bandwidth is: compression is next.
BUCKET_FACTOR = 2
MAX_BUCKET_RAISES = 2
# Each engine's setting for the size of the gradients one all-reduce carries (TensorFlow's has none).
BUCKET_SETTING = {"horovod": "fusion_threshold_mb", "ddp": "bucket_cap_mb"}
# A straggler that follows the job onto a third node is its data partition or its work, not the node.
MAX_AVOIDED_NODES = 2
# A store outage is not the job's fault and ends on its own: wait longer each time, never give up here
# (the task's retries bound how often).
STORE_WAIT_SECONDS = 60.0
MAX_STORE_WAIT_SECONDS = 600.0
# Two smaller batches and still out of memory: the model, its gradients and optimizer state fill the rank,
# which no batch size changes (oom_advice.py's later options are the owner's: a smaller model, more memory).
MAX_BATCH_SPLITS = 2
# The backends whose pods a next try can keep off a node (TrainJob and MPIJob pods have a node each).
NODE_BACKENDS = (MPIJOB, TRAINJOB)


@dataclasses.dataclass(frozen=True)
class Remedy:
    """The next try's change. `verdict`: what it answers (the status, and for DEGRADED its kind, e.g.
    "DEGRADED/straggler"). `words`: why, a sentence for the task log. Under CHANGE: `remedy` (one of
    REMEDIES), `settings` (dotted config key -> new value), and where it applies `resume_before_step` (resume
    from the newest checkpoint before this step), `avoid_nodes` (every node the next try must keep off, this
    remedy's and the earlier ones') and `wait_seconds` (before the next try starts)."""

    action: RemedyAction
    verdict: str
    words: str
    remedy: RemedyName | None = None
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    resume_before_step: int | None = None
    avoid_nodes: tuple[str, ...] = ()
    wait_seconds: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", RemedyAction.of(self.action, "remedy action"))
        if (self.action == RemedyAction.CHANGE) != (self.remedy is not None):
            raise ValueError(f"remedy {self.remedy!r} with action {self.action.value!r}: a change names one of "
                             f"{tuple(r.value for r in RemedyName)}, {RemedyAction.AS_IS.value!r} and "
                             f"{RemedyAction.GIVE_UP.value!r} none")
        if self.remedy is not None:
            object.__setattr__(self, "remedy", RemedyName.of(self.remedy, "remedy"))
        if self.action != RemedyAction.CHANGE and (self.settings or self.avoid_nodes or self.wait_seconds
                                      or self.resume_before_step is not None):
            raise ValueError(f"remedy action {self.action.value!r} changes nothing; give settings, nodes, a wait "
                             f"or a resume step only with {RemedyAction.CHANGE.value!r}")
        object.__setattr__(self, "settings", dict(self.settings))
        object.__setattr__(self, "avoid_nodes", tuple(self.avoid_nodes))

    @property
    def changes(self) -> bool:
        return self.action == RemedyAction.CHANGE

    def applied_to(self, cfg: JobConfig) -> JobConfig:
        """`cfg` with `settings` set, checked again as a whole (JobConfig.from_dict)."""
        doc = cfg.to_dict()
        for key, value in self.settings.items():
            *path, name = key.split(".")
            section = doc
            for part in path:
                section = section[part]
            section[name] = value
        return JobConfig.from_dict(doc)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"action": self.action.value, "settings": dict(self.settings),
                                           "remedy": self.remedy.value if self.remedy is not None else None,
                                           "avoid_nodes": list(self.avoid_nodes)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "Remedy":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def _change(verdict: str, words: str, remedy: RemedyName, settings: Mapping[str, Any] | None = None,
            **more: Any) -> Remedy:
    return Remedy(RemedyAction.CHANGE, verdict, words, remedy, settings or {}, **more)


def _give_up(verdict: str, words: str) -> Remedy:
    return Remedy(RemedyAction.GIVE_UP, verdict, words)


def _as_is(verdict: str, words: str) -> Remedy:
    return Remedy(RemedyAction.AS_IS, verdict, words)


def verdict_name(verdict: Verdict | None) -> str:
    """The verdict's status, and for DEGRADED what it found: the key a remedy answers."""
    if verdict is None:
        return "none"
    kind = verdict.evidence.get("kind") if verdict.status == DEGRADED else None
    return f"{verdict.status}/{kind}" if kind else verdict.status


def remedy(verdict: Verdict | None, cfg: JobConfig, history: Sequence[Remedy], *, world_size: int,
           backend_kind: str, rank_nodes: Mapping[int, str] | None = None) -> Remedy:
    """The next try's change after a try ended on `verdict`. cfg: the config that try ran with (earlier
    remedies already applied). history: the remedies earlier tries of this run took, oldest first.
    world_size/backend_kind: where it ran. rank_nodes: rank -> the node it ran on, where the backend knows."""
    name = verdict_name(verdict)
    if cfg.remediation != REMEDIATION_AUTO:
        return _as_is(name, f'remediation is "{cfg.remediation}": the next try runs unchanged (set '
                            '"remediation": "auto" for ringflow to change it after a health verdict)')
    rule = _RULES.get(name)
    if rule is None:
        return _as_is(name, f"no remedy for {name}: the failure policy retries or fails it as it would "
                            "without remediation")
    taken = [h for h in history if h.changes]
    return rule(verdict, cfg, taken, world_size=world_size, backend_kind=backend_kind, rank_nodes=rank_nodes or {})


def _count(history: Sequence[Remedy], kind: RemedyName) -> int:
    return sum(h.remedy == kind for h in history)


def _nonfinite(verdict: Verdict, cfg: JobConfig, history, **_) -> Remedy:
    replay = verdict.evidence.get("replay")
    if isinstance(replay, Mapping) and "reproducible" in replay:
        return _replayed(verdict, replay, history, cfg)
    name, cuts = verdict_name(verdict), _count(history, RemedyName.LOWER_LEARNING_RATE)
    if cuts >= MAX_LEARNING_RATE_CUTS:
        return _give_up(name, f"NaN/Inf again after the learning rate was cut {cuts} times (now "
                              f"{cfg.learning_rate:g}): check the input data for NaN/Inf or clip gradients")
    step = verdict.evidence.get("step")
    lr = cfg.learning_rate * LEARNING_RATE_FACTOR
    where = f"the newest checkpoint before step {step}" if step is not None else "the newest checkpoint"
    return _change(name, f"NaN/Inf at step {step}: resume from {where} with learning_rate "
                         f"{cfg.learning_rate:g} -> {lr:g} (cut {cuts + 1} of {MAX_LEARNING_RATE_CUTS})",
                   RemedyName.LOWER_LEARNING_RATE, {"learning_rate": lr}, resume_before_step=step)


def _replayed(verdict: Verdict, replay: Mapping[str, Any], history, cfg: JobConfig) -> Remedy:
    """NONFINITE whose step the rank replayed on the last checkpoint's state: the data, or a transient fault."""
    name, step = verdict_name(verdict), verdict.evidence.get("step")
    if not replay["reproducible"]:
        retries = _count(history, RemedyName.PLAIN_RETRY)
        if retries >= MAX_PLAIN_RETRIES:
            return _give_up(name, f"NaN/Inf at step {step} that its replay did not reproduce, for the "
                                  f"{retries + 1}th time: a transient fault that keeps coming back is the "
                                  "machine's; check its hardware (memory errors, GPU health)")
        return _change(name, f"NaN/Inf at step {step} that its replay did not reproduce: a transient fault "
                             f"(hardware, a race), so the next try resumes before step {step} unchanged "
                             f"(retry {retries + 1} of {MAX_PLAIN_RETRIES})", RemedyName.PLAIN_RETRY,
                       resume_before_step=step)
    rows = [dict(r) for r in replay.get("rows") or ()]
    skips = [h for h in history if h.remedy == RemedyName.SKIP_ROWS]
    if not rows:
        return _give_up(name, f"NaN/Inf at step {step}, reproducible on replay, but the replay named no "
                              "rows: check the input data for NaN/Inf")
    if len(skips) >= MAX_ROW_SKIPS:
        return _give_up(name, f"NaN/Inf at step {step} from data again, after rows were skipped "
                              f"{len(skips)} times: clean the data set (the verdict names the rows)")
    # Every row skipped so far stays skipped: the owner's own skip_rows (in the config the failed try ran
    # with), then the latest skip's, which holds every earlier skip's.
    earlier = [{"file": r.file, "row": r.row} for r in cfg.skip_rows]
    for r in (skips[-1].settings.get(SKIP_ROWS_SETTING, ()) if skips else ()):
        if dict(r) not in earlier:
            earlier.append(dict(r))
    skipped = earlier + [r for r in rows if r not in earlier]
    said = ", ".join(f"{r.get('file')} row {r.get('row')}" for r in rows)
    return _change(name, f"NaN/Inf at step {step} reproduced on replay: the data. The next try resumes "
                         f"before step {step} and skips {said} (skip {len(skips) + 1} of {MAX_ROW_SKIPS})",
                   RemedyName.SKIP_ROWS, {SKIP_ROWS_SETTING: skipped}, resume_before_step=step)


def _sync_bound(verdict: Verdict, cfg: JobConfig, history, **_) -> Remedy:
    name, raises = verdict_name(verdict), _count(history, RemedyName.WIDER_BUCKETS)
    share = verdict.evidence.get("share")
    said = f"all-reduce took {share:.0%} of each step" if isinstance(share, (int, float)) else "sync-bound"
    section = engine_spec(cfg.engine).config_section
    knob = BUCKET_SETTING.get(cfg.engine)
    if knob is not None and raises < MAX_BUCKET_RAISES:
        settings = getattr(cfg, section)
        now = getattr(settings, knob)
        # Horovod's 0 turns fusion off: doubling it would keep it off, so the next try gets the default back.
        new = now * BUCKET_FACTOR if now > 0 else getattr(type(settings), knob)
        return _change(name, f"{said}: {section}.{knob} {now:g} -> {new:g} MB, fewer and larger "
                             f"all-reduces (raise {raises + 1} of {MAX_BUCKET_RAISES})",
                       RemedyName.WIDER_BUCKETS, {f"{section}.{knob}": new})
    if cfg.engine == "horovod" and not cfg.horovod.fp16_compression:
        return _change(name, f"{said} with larger fusion buffers too: horovod.fp16_compression on, "
                             "half the bytes on the wire", RemedyName.COMPRESS_GRADIENTS,
                       {"horovod.fp16_compression": True})
    return _give_up(name, f"{said} and ringflow has no remedy left for engine {cfg.engine!r}: raise "
                          "batch_size or backward_passes_per_step, or use fewer workers")


def _straggler(verdict: Verdict, cfg: JobConfig, history, *, backend_kind: str, rank_nodes, **_) -> Remedy:
    name, rank = verdict_name(verdict), verdict.evidence.get("rank")
    if backend_kind not in NODE_BACKENDS:
        return _give_up(name, f"rank {rank} straggles on a {backend_kind} backend, where every try runs "
                              "on the same host: check its load, or the rank's data partition")
    avoided = tuple(n for h in history if h.remedy == RemedyName.AVOID_NODE for n in h.avoid_nodes)
    avoided = tuple(dict.fromkeys(avoided))
    node = rank_nodes.get(rank)
    if node is None:
        return _give_up(name, f"rank {rank} straggles, and the node it ran on is not known: check the "
                              "job's pods for the node, and that node's load")
    if len(avoided) >= MAX_AVOIDED_NODES or node in avoided:
        return _give_up(name, f"rank {rank} straggles on node {node} after the job kept off "
                              f"{list(avoided)}: it follows the job, so look at the rank's data partition "
                              "or work, not the nodes")
    also = f" (and off {list(avoided)}, as before)" if avoided else ""
    return _change(name, f"rank {rank} straggles on node {node}: the next try keeps off it{also}",
                   RemedyName.AVOID_NODE, avoid_nodes=avoided + (node,))


def _store(verdict: Verdict, cfg: JobConfig, history, **_) -> Remedy:
    waits = _count(history, RemedyName.WAIT_FOR_STORE)
    wait = min(STORE_WAIT_SECONDS * 2 ** waits, MAX_STORE_WAIT_SECONDS)
    store = verdict.evidence.get("store") or "the store"
    return _change(verdict_name(verdict), f"{store} was unavailable: wait {wait:g}s for it, then retry "
                                          "from the last checkpoint", RemedyName.WAIT_FOR_STORE, wait_seconds=wait)


def _oom(verdict: Verdict, cfg: JobConfig, history, *, world_size: int, **_) -> Remedy:
    name, splits = verdict_name(verdict), _count(history, RemedyName.SMALLER_BATCH)
    if splits >= MAX_BATCH_SPLITS:
        return _give_up(name, f"out of memory again after the per-worker batch was made smaller {splits} "
                              f"times (now {cfg.batch_size}): use a smaller model or give each rank more "
                              "memory")
    # From the config, not the verdict's evidence: an OOM seen outside the job (a pod OOMKilled) carries
    # advice without numbers, since the config was not known where it was seen.
    advice = next((a for a in advise(JobShape.of(cfg, world_size)) if a.option == ACCUMULATE), None)
    if advice is None:
        return _give_up(name, f"out of memory with batch_size {cfg.batch_size} on engine {cfg.engine!r}, "
                              "which cannot be split keeping the global batch: use a smaller model or give "
                              "each rank more memory")
    return _change(name, f"out of memory: {advice.words} (split {splits + 1} of {MAX_BATCH_SPLITS})",
                   RemedyName.SMALLER_BATCH, advice.settings)


_RULES = {NONFINITE: _nonfinite, f"{DEGRADED}/{SYNC_BOUND}": _sync_bound, f"{DEGRADED}/{STRAGGLER}": _straggler,
          STORE_UNAVAILABLE: _store, OOM: _oom}


@dataclasses.dataclass(frozen=True)
class PlannedRemedy:
    """A remedy and the try it is for: a line of the run folder's remedies.jsonl (RunFolder.read_remedies)."""

    try_number: int
    remedy: Remedy

    def __post_init__(self) -> None:
        if not isinstance(self.try_number, int) or isinstance(self.try_number, bool) or self.try_number < 2:
            raise ValueError(f"a planned remedy's try is {self.try_number!r}; a remedy is for a retry (try >= 2)")

    def to_dict(self) -> dict[str, Any]:
        return {"try": self.try_number, **self.remedy.to_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "PlannedRemedy":
        try:
            return cls(int(doc["try"]), Remedy.from_dict(doc))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a line of remedies.jsonl is not a planned remedy ({exc!r}: {dict(doc)}); delete the "
                             "file to retry without the remedies of earlier tries") from None

    def applied(self) -> dict[str, Any]:
        """What the ranks get in their config's `remedies`, and write in their result."""
        name = self.remedy.remedy.value if self.remedy.remedy is not None else None
        return dict(zip(APPLIED_REMEDY_FIELDS, (self.try_number, self.remedy.verdict, name, self.remedy.words)))


def taken_before(planned: Sequence[PlannedRemedy], try_number: int) -> list[PlannedRemedy]:
    """The changes planned for tries up to `try_number`, in order: what that try runs with. A plan for a
    later try (a retry that never came) is not."""
    return [p for p in planned if p.try_number <= try_number and p.remedy.changes]


def apply_remedies(cfg: JobConfig, planned: Sequence[PlannedRemedy], try_number: int) -> JobConfig:
    """The config try `try_number` runs with: `cfg` (the task's own) with every change planned up to this try
    applied in order (a learning rate cut after a NaN stays cut on the next OOM's try), `remedies` listing
    them, and this try's own resume step (an earlier try's would send it back behind the progress made since)."""
    taken = taken_before(planned, try_number)
    for p in taken:
        cfg = p.remedy.applied_to(cfg)
    own = next((p.remedy for p in taken if p.try_number == try_number), None)
    return dataclasses.replace(cfg, remedies=tuple(p.applied() for p in taken),
                               resume_before_step=own.resume_before_step if own is not None else None)


def avoided_nodes(planned: Sequence[PlannedRemedy], try_number: int) -> tuple[str, ...]:
    """Every node try `try_number` keeps off: a straggler's node stays avoided on later tries."""
    return tuple(dict.fromkeys(n for p in taken_before(planned, try_number) for n in p.remedy.avoid_nodes))


def wait_before(planned: Sequence[PlannedRemedy], try_number: int) -> float:
    """How long try `try_number` waits before it launches (its own remedy's wait only)."""
    return sum(p.remedy.wait_seconds for p in taken_before(planned, try_number) if p.try_number == try_number)


def remedy_words(applied: Mapping[str, Any]) -> str:
    """One applied remedy (JobConfig.remedies / RunResult.remedies) in a few words, for a plot's title, the
    health summary, MLflow and the gate: "try 2: lower_learning_rate after NONFINITE"."""
    return f"try {applied.get('try')}: {applied.get('remedy')} after {applied.get('verdict')}"


def rank_nodes(records: Sequence[Mapping[str, Any]] | None) -> dict[int, str]:
    """rank -> the node it ran on, from the newest `start` record that lists them (rank 0 writes every rank's,
    rank/node_names.py): what a straggler remedy keeps the next try off. {} when no record says."""
    starts = [r for r in records or () if r.get("type") == "start" and isinstance(r.get("nodes"), list)]
    # "" is a rank whose node is not known (rank/worker_env.node_name): left out, so the remedy says so.
    return {rank: str(n) for rank, n in enumerate(starts[-1]["nodes"]) if n} if starts else {}
