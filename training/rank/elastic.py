"""Recovery inside the job: a rank of an elastic Horovod job (the config's `elastic`; engine "horovod", ringflow's
own loop). A worker that dies costs the survivors the steps since their last commit and a few seconds, not a
retry of the whole job.

    the process: liveness first (no claim yet: which worker is rank 0 is the rendezvous's word), hvd.init()
    Horovod's elastic loop (horovod/common/elastic.py run_fn), round after round:
        sync       the newest commit any worker holds, broadcast from the lowest rank that holds it (a worker
                   that has just joined holds none)
        train      a Trainer on this membership (rank, size), resumed from that commit as from a checkpoint on
                   another world size: the epoch's unseen rows dealt among the workers there are now, the
                   accumulation and learning rate rescaled (world_size_change.py); the first round resumes
                   from the run folder as any attempt does. The new rank 0 claims the run folder when it was
                   not the writer (the old writer, if it is alive and frozen, is fenced from then on); a writer
                   that stays rank 0 keeps its checkpoint writer, whose upload in flight goes on beside the
                   next round (ElasticRun.checkpoint_writer).
        commit     every elastic.commit_every_steps steps (ElasticCommit): each rank copies its state into its
                   own memory, then Horovod's check for changed hosts, a collective, so every rank raises
                   HostsUpdatedInterrupt at the same step
        a change   a collective that failed (a peer died: HorovodInternalError) or hosts that changed: the
                   change is recorded (commits.Membership), the round's trainer let go, hvd.shutdown() + hvd.init()

A rank that hangs (alive, its training thread blocked outside a collective) ends itself when its stall watchdog
fires; its peers, blocked in a collective with it (in_a_collective), wait longer (liveness.PEER_WAIT_STALLS), so
its death fails their collective and they go on without it.

Fewer than elastic.min_workers left: Horovod's driver waits elastic.wait_seconds, then ends the job (the launcher
says why: core/elastic_hosts.py too_few_workers), and the task's retry resumes from the last checkpoint as before.
Checkpoints go to the store as always; a commit is memory only.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import horovod.torch as hvd
import torch
from horovod.common.elastic import State, run_fn
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.runner.elastic.worker import HostUpdateResult

from ..formats.config import JobConfig
from ..health.progress import RENDEZVOUS
from .engines.horovod import HorovodEngine
from .engines.horovod_objects import broadcast_object
from .commits import JOINED, LEFT, ROUND_META, Commit, CountedCommits, Membership, record_change
from .rank_start import RankStart
from .worker_env import launcher_rank

class ElasticState(State, CountedCommits):
    """Horovod's elastic State over ringflow's commits: save copies the round's training state into memory,
    restore keeps the last commit (`committed`) for the next round, sync hands the newest commit to every worker."""

    def __init__(self):
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)
        self.committed: Commit | None = None
        self.trainer = None  # the round's worker.Trainer (save reads its loop)

    def save(self) -> None:
        self.committed = self.trainer.commit()

    def restore(self) -> None:
        """The next round starts from self.committed: nothing to undo in place (the round's model is dropped)."""

    def check_host_updates(self) -> None:
        """Horovod's check for changed hosts, as one small max-allreduce (the newest update any rank was told
        of, whether hosts were removed, added) instead of rank 0's two pickled broadcasts: its cost is the
        commit's (bench/results/elastic_recovery.md), and any rank may be the one the driver told first."""
        newest, removed, added = self._last_updated_timestamp, 0.0, 0.0
        while not self._host_messages.empty():
            timestamp, update = self._host_messages.get()
            if timestamp > newest:
                newest = timestamp
            removed = max(removed, float(bool(update & HostUpdateResult.removed)))
            added = max(added, float(bool(update & HostUpdateResult.added)))
        # The previous update is agreed too: a worker that has just joined still holds the driver's word of its
        # own arrival, which the others have already acted on, and must not act on it alone.
        agreed = hvd.allreduce(torch.tensor([newest, self._last_updated_timestamp, removed, added],
                                            dtype=torch.float64), op=hvd.Max, name="ringflow.hosts").tolist()
        newest, previous, removed, added = agreed
        self._last_updated_timestamp = newest
        if newest > previous:
            raise HostsUpdatedInterrupt(bool(removed) and not added)  # skip_sync: hosts only removed

    def sync(self) -> None:
        steps = hvd.allgather_object(self.committed.step if self.committed is not None else -1, name="ringflow.commits")
        newest = max(steps)
        if newest < 0:
            return  # nobody has committed: the round resumes from the run folder
        root = steps.index(newest)
        self.committed = broadcast_object(hvd, self.committed if hvd.rank() == root else None, root_rank=root,
                                          name="ringflow.commit")


class ElasticRun:
    """One process of an elastic job from its first round to its exit code; run_rank's trainer (train, and what
    a store failure's last word reads: guard, health_log, result)."""

    def __init__(self, cfg: JobConfig, make_trainer, start: RankStart, placement):
        """make_trainer(cfg, engine, start, elastic): the round's worker.Trainer. placement: where this process
        computes (chosen once, when Horovod first started)."""
        self.cfg, self.make_trainer, self.start, self.placement = cfg, make_trainer, start, placement
        self.state = ElasticState()
        self.changes: list[Membership] = []
        self.trainer = None
        self.round = 0  # the job's round: 0 until the first change of workers, one more after each
        self.resumed_from: str | None = None  # the run folder's checkpoint the first round resumed from
        self.workers: tuple[str, ...] = ()  # this round's workers by name, in rank order
        self._pending: dict[str, Any] | None = None  # the change seen, until the next round has resumed
        # The run folder writer's checkpoint writer, from round to round while this process stays rank 0: the
        # upload a round left in flight goes on beside the next one, whose trainer takes the writer over, so a
        # survivor goes on at once, not after the upload's rest (at a user's size, tens of seconds through a
        # slow link). None on the other ranks.
        self.checkpoint_writer = None
        # No ranges kept on the host (host_ranges.py): a survivor keeps its reader, and a worker that joins
        # starts on a host that read nothing.
        self.host_ranges = None
        # A survivor's commit is its own, and a worker that joins has none: rank 0's state is broadcast.
        self.restored_alike = False

    # -- what run_rank's store-failure path reads --------------------------------------------------------------

    @property
    def guard(self):
        return self.start.guard

    @property
    def health_log(self):
        return self.trainer.health_log if self.trainer is not None else None

    def result(self, status, verdict, checkpoint):
        return self.trainer.result(status, verdict, checkpoint)

    # -- the rounds --------------------------------------------------------------------------------------------

    def train(self) -> int:
        return run_fn(self._round, self._reset)(self.state)

    def _reset(self) -> None:
        self.start.liveness.progress.phase(RENDEZVOUS)  # a new rendezvous: its wait is start-up, not silence
        hvd.shutdown()
        hvd.init()

    def _round(self, state: ElasticState) -> int:
        # The job's round, the same on every worker, one that has just joined included: one past the round of
        # the commit it resumes from.
        self.round = state.committed.meta[ROUND_META] + 1 if state.committed is not None else 0
        engine = HorovodEngine(hvd, self.cfg.horovod, self.placement)
        self.workers = tuple(hvd.allgather_object(worker_name(os.environ), name="ringflow.workers"))
        self._take_writer(engine.rank)
        trainer = self.trainer = self.make_trainer(self.cfg, engine, self.start, self)
        state.trainer = trainer
        if self.round == 0:
            self.resumed_from = trainer.resumed_from
        if self._pending is not None:
            seen, self._pending = self._pending, None
            trainer.elastic_commit.on_first_step(lambda: self._recovered(trainer, seen))
        try:
            return trainer.train()
        except HorovodInternalError as exc:
            self._seen(LEFT, exc, trainer)
            raise
        except HostsUpdatedInterrupt as exc:  # skip_sync: hosts were only removed
            self._seen(LEFT if exc.skip_sync else JOINED, exc, trainer)
            raise

    def _recovered(self, trainer, seen: dict[str, Any]) -> None:
        """After the first step of the round that followed a change: the change, as it cost."""
        seen = dict(seen)
        before = seen.pop("workers")
        record_change(self.changes, trainer, seen, left=tuple(w for w in before if w not in self.workers),
                      joined=tuple(w for w in self.workers if w not in before))

    def _seen(self, why: str, exc: BaseException, trainer) -> None:
        """A change of workers seen by this rank: what it costs, kept until the next round has resumed; the
        round's trainer let go (its checkpoint upload in flight finished first, on rank 0)."""
        commit = self.state.committed
        step = trainer.loop.step if trainer.loop is not None else trainer.step
        detail = ("Horovod's driver added hosts" if why == JOINED else "Horovod's driver removed hosts"
                  if isinstance(exc, HostsUpdatedInterrupt) else "a collective failed: a peer died or stopped "
                  f"answering (Horovod: {' '.join(str(exc).split()).split('. ')[0][:120]})")
        # A step past the commit is redone; HostsUpdatedInterrupt comes right after a commit (none redone).
        self._pending = {"why": why, "detail": detail, "from_world_size": trainer.size,
                         "commit_step": commit.step if commit is not None else None,
                         "steps_redone": step - commit.step if commit is not None else step,
                         "failed_at": time.time(), "rank0_changed": False, "seen_at_step": step,
                         "workers": self.workers}
        print(f"[ringflow] rank {trainer.rank}: workers changed at step {step} ({why}: {detail})", flush=True)
        trainer.let_go()
        self.checkpoint_writer = trainer.checkpointing.writer

    def _take_writer(self, rank: int) -> None:
        """The round's rank 0 writes the run folder: a process that becomes rank 0 claims it (fencing the old
        writer); one that was the writer and is rank 0 no more stops writing."""
        start = self.start
        start.liveness.rank = rank
        if rank == 0 and start.guard is None:
            if self._pending is not None:
                self._pending["rank0_changed"] = True
            start.claim()
        elif rank != 0 and start.guard is not None:
            if self.checkpoint_writer is not None:  # its upload in flight ends first, published as it was due
                self.checkpoint_writer.wait_for(self.cfg.health.store_timeout_seconds)
                self.checkpoint_writer = None
            if start.liveness.heartbeat is not None:
                start.liveness.heartbeat.stop()
                start.liveness.heartbeat = None
            if start.health_log is not None:
                start.health_log.close()
            start.guard, start.health_log = None, None


def worker_name(environ) -> str:
    """A worker's name in the membership records: its slot (the host name Horovod's driver started it on: on one
    machine, a name of the loopback address of its own, core/elastic_hosts.py) and its local rank there."""
    return f"{environ.get('HOROVOD_HOSTNAME', 'localhost')}:{environ.get('HOROVOD_LOCAL_RANK', '0')}"


def run(cfg: JobConfig, make_trainer) -> int:
    """An elastic Horovod rank from its start to its exit code (run_rank's wrapping: a store that kept failing,
    an OOM, bad input)."""
    from .rank_run import run_rank

    def begin(cfg: JobConfig) -> RankStart:
        start = RankStart.begin(cfg, launcher_rank(os.environ) or 0, _exit_on_stall, claim=False)
        start.liveness.progress.peers_check = in_a_collective(threading.get_ident())
        return start

    def elastic_trainer(cfg, engine, start):
        return ElasticRun(cfg, make_trainer, start, engine.placement)

    return run_rank(cfg, lambda cfg: HorovodEngine.start(cfg), elastic_trainer, begin=begin)


def in_a_collective(thread: int):
    """Whether `thread` (the training thread) is blocked in a Horovod collective now: its stack holds Horovod's
    wait for a collective's handle (horovod/torch/mpi_ops.py synchronize: the gradients' all-reduce, the
    commit's check, a broadcast). A rank that hangs elsewhere (its own code, its data) is not."""
    def check() -> bool:
        frame = sys._current_frames().get(thread)
        while frame is not None:
            if frame.f_code.co_name == "synchronize" and frame.f_code.co_filename.endswith(_HOROVOD_WAIT):
                return True
            frame = frame.f_back
        return False
    return check


_HOROVOD_WAIT = os.path.join("horovod", "torch", "mpi_ops.py")


def _exit_on_stall(verdict) -> None:
    from ..formats import exit_codes

    print(f"[ringflow] {verdict.reason}", file=sys.stderr, flush=True)
    os._exit(exit_codes.for_verdict(verdict.status))
