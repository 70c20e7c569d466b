"""What recovery inside the job keeps and records, for both of its kinds (Horovod elastic: elastic.py; DDP's
restart from a peer copy: ddp_elastic.py): a rank's commit of its training state and how a round resumes from it,
the callback that commits every few steps, and each change of workers as the records, result.json and the log say
it. Horovod-free: a DDP rank imports it.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

from ..health.records import record
from .callbacks.base import Callback
from .callbacks.logging import say
from .training_state import TrainingState

# Why the workers changed, in the records.
LEFT, JOINED = "left", "joined"
# A commit's round (ElasticRun.round), in its meta.
ROUND_META = "elastic_round"


@dataclasses.dataclass(frozen=True)
class Commit:
    """The training state one rank copied into its memory at a step: what a checkpoint of that step would hold
    (`state`) and say in its manifest (`meta`, Checkpointing.meta), so a round resumes from it as from one."""

    state: TrainingState
    meta: Mapping[str, Any]

    @property
    def step(self) -> int:
        return self.state.step


@dataclasses.dataclass(frozen=True)
class _CommitManifest:
    meta: Mapping[str, Any]
    name: str


@dataclasses.dataclass(frozen=True)
class _CommitAsCheckpoint:
    """What the Trainer reads of a found checkpoint (its manifest's meta and name), for a commit."""

    manifest: _CommitManifest


def as_found(commit: Commit) -> tuple[_CommitAsCheckpoint, TrainingState]:
    return _CommitAsCheckpoint(_CommitManifest(dict(commit.meta), f"the commit of step {commit.step}")), commit.state


class CountedCommits:
    """The training thread's time in commits (the copy, and for Horovod the check for changed hosts) and their
    number, over every round of this process: what the commits cost (result.json, bench/elastic_recovery.py)."""

    commit_seconds: float = 0.0
    commits: int = 0

    def commit(self) -> None:
        raise NotImplementedError

    def timed_commit(self) -> None:
        """commit(), its time counted (a change it raises ends the round: that commit is not counted)."""
        started = time.perf_counter()
        self.commit()
        self.commit_seconds += time.perf_counter() - started
        self.commits += 1


class ElasticCommit(Callback):
    """Every `every` steps, and as the round starts, the commit (ElasticState.commit: save, then the
    collective check for changed hosts, which raises HostsUpdatedInterrupt on every rank alike). Last in a
    step, after the checkpoint: a commit holds what the step's checkpoint holds."""

    def __init__(self, state: ElasticState, every: int):
        self.state, self.every = state, every
        self._on_first_step = None

    def on_first_step(self, call) -> None:
        """`call()` once, after the round's first step (a recovery ends there)."""
        self._on_first_step = call

    def on_train_start(self, loop) -> None:
        self.state.timed_commit()

    def on_step_end(self, loop, timing) -> None:
        if self._on_first_step is not None:
            self._on_first_step()
            self._on_first_step = None
        if timing.step % self.every == 0:
            self.state.timed_commit()


@dataclasses.dataclass(frozen=True)
class Membership:
    """One change of an elastic job's workers, as the records, result.json and the log say it."""

    why: str                 # LEFT (a collective failed: a worker died or was cut off) or JOINED (hosts added)
    detail: str              # the error Horovod raised, in a line
    from_world_size: int
    to_world_size: int
    commit_step: int | None  # the step the survivors went back to (None: no commit yet, the run folder's)
    steps_redone: int        # steps trained after that commit, lost with the change
    failed_at: float         # unix time the change was seen (the collective failed, the commit raised)
    resumed_at: float        # unix time the next round's first step ended
    rank0_changed: bool = False
    seen_at_step: int | None = None  # the last step the round that ended had completed
    left: tuple[str, ...] = ()       # the workers gone, by name (worker_name: their slot), as the survivors saw them
    joined: tuple[str, ...] = ()     # the workers new in the next round
    # Bytes of rank 0's first reads after a DDP restart served from the host's memory, not the store
    # (host_ranges.py); None where the next round reads through its reader as it was (Horovod's survivors).
    data_from_host_bytes: int | None = None

    @property
    def recovery_seconds(self) -> float:
        return self.resumed_at - self.failed_at

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"recovery_seconds": round(self.recovery_seconds, 3)}

    def describe(self) -> str:
        went = f"back to the commit of step {self.commit_step}" if self.commit_step is not None else "from the run folder"
        who = "; ".join(f"{what} {', '.join(names)}" for what, names in (("left:", self.left), ("joined:", self.joined))
                        if names)
        return (f"workers changed ({self.why}: {self.detail}{'; ' + who if who else ''}): "
                f"{self.from_world_size} -> {self.to_world_size}, "
                f"{went}, {self.steps_redone} step(s) redone, its first step {self.recovery_seconds:.2f}s after"
                + (f" (rank 0's first data from the host's memory: {self.data_from_host_bytes / 2**20:.1f} MiB)"
                   if self.data_from_host_bytes else ""))


def record_change(changes: list, trainer, seen: Mapping[str, Any], **more: Any) -> Membership:
    """After the first step of the round that followed a change: the change, as it cost (`seen` when it was seen,
    `more` what only the new round knows), kept in `changes` and, on rank 0, said and recorded."""
    change = Membership(**seen, **more, to_world_size=trainer.size, resumed_at=time.time())
    changes.append(change)
    if trainer.rank == 0:
        say(change.describe())
        trainer.health_log.append(record("membership", **change.as_record()), force_flush=True)
    return change

