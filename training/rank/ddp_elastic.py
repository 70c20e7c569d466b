"""Recovery inside the job for DDP (the config's `elastic` with engine "ddp"): torchrun's own restart, from a
host's copy of the newest state (peer_copy.py) rather than from the store.

    the launch  torchrun with restarts (launcher.torchrun_command): a rank that dies makes torchrun stop
                every worker and start them all again, at once, in the same try (no retry, no retry_delay),
                with the same attempt id; TORCHELASTIC_RESTART_COUNT is the job's round (0 first)
    the copy    every elastic.commit_every_steps steps, each host's local rank 0 copies the state into its
                memory on the training thread (Trainer.commit: what a checkpoint of the step holds) and a
                thread of its own writes it to the host's copy folder; every step it notes the step ended
                (peer_copy.BeatFile)
    the data    every rank keeps the byte ranges it reads from the store (footers, row groups) in the host's
                copy folder, those its first windows after each commit read pinned (host_ranges.py): the
                restarted workers read their first windows from memory, not through the link again
    a restart   before the Trainer: the ranks gather each host's newest copy step, rank 0 the store's newest
                checkpoint step; the newest wins (peer_copy.choose); a copy is read by every rank from the
                memory disk when they all run on its host, else broadcast from its holder; the Trainer resumes
                from it as from a checkpoint (commits.as_found; a resume on another world size deals the
                epoch's unseen rows and rescales as any does). The new rank 0 claims the run folder, as any
                rank 0 does (rank_start.begin_early), fencing nothing alive: torchrun stopped the old one.
    recorded    after the first step of a restarted round, its change (commits.Membership: why, from and to
                world size, the step gone back to, the steps redone, when it failed, when the first step
                ended) in the log, the health records and result.json, with the changes before it (carried
                in the copy's meta)

A rank that ends on purpose (a health verdict, bad input, out of memory: run_rank's exit code) notes its code in
the copy folder; torchrun restarts on any failure, and the restarted ranks then end at once with that code, so
the failure policy sees the verdict as without elastic (one restart later: forked ranks, rank/forked_torchrun.py). A crash, a kill
or a stall is restarted.

Fewer workers after a restart happen only where torchrun runs one agent per host (--nnodes MIN:MAX); the local
backend runs one agent for the host's workers, so a restart brings back as many. The launcher removes the copy
folder when the job ends, whatever its end (launcher.run_attempt).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import threading
import time
from typing import Any, Mapping

import torch.distributed as dist

from ..formats.checkpoint import older_than, step_of
from ..formats.config import JobConfig
from ..formats.run_folder import RunFolder
from .callbacks.base import Callback
from .callbacks.logging import say
from .commits import LEFT, Commit, CountedCommits, record_change
from .host_ranges import HostRanges, give_way
from .partition_batches import WINDOWS_HELD
from .last_word import ENDING, SIGTERM_WORD_SECONDS, on_sigterm
from .peer_copy import (META_FILE, BeatFile, Choice, Source, choose, copy_folder, copy_name, newest_copy, read_end,
                        remove, same_host_only, write_end)
from .rank_start import RankStart, store_call, within
from .training_state import STATE_FILE, TrainingState
from .worker_env import ATTEMPT_ENV, launcher_local_rank

# torchrun's count of restarts in this job, for every worker it starts.
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# The changes before this round, carried in each copy's meta (a restarted process remembers nothing).
CHANGES_META = "membership_changes"


def restart_count(environ: Mapping[str, str] = os.environ) -> int:
    value = environ.get(RESTART_COUNT_ENV, "0")
    return int(value) if value.isdigit() else 0


class CopyWriter:
    """The host's copies, written by a thread of its own: the newest commit handed in is written, one not yet
    written when a newer comes is dropped (only the newest is kept anyway)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.written_step: int | None = None
        self.write_seconds: list[float] = []  # each copy's write, off the training thread
        self.failure: BaseException | None = None
        self._pending: Commit | None = None
        self._wake = threading.Condition()
        self._busy = False
        threading.Thread(target=self._run, name="ringflow-peer-copy", daemon=True).start()

    def submit(self, commit: Commit) -> None:
        with self._wake:
            self._pending = commit
            self._wake.notify()

    def wait(self, seconds: float) -> bool:
        """Whether every commit handed in is written, after waiting at most `seconds`."""
        deadline = time.monotonic() + seconds
        with self._wake:
            while self._pending is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._wake.wait(left):
                    return False
        return True

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None:
                    self._wake.wait()
                commit, self._pending, self._busy = self._pending, None, True
            try:
                started = time.perf_counter()
                try:
                    write_copy(self.folder, commit)
                except Exception:  # noqa: BLE001 - torch.save's full disk is a RuntimeError
                    # The copy comes first: the ranges the ranks kept beside it go (host_ranges.py), then again.
                    give_way(self.folder)
                    write_copy(self.folder, commit)
                self.write_seconds.append(time.perf_counter() - started)
                self.written_step = commit.step
            except Exception as exc:  # noqa: BLE001 - a copy that fails leaves the older copy, and the store
                if self.failure is None:
                    say(f"the peer copy of step {commit.step} could not be written ({exc!r}); a restart resumes "
                        "from an older copy or the store's checkpoint")
                self.failure = exc
            with self._wake:
                self._busy = False
                self._wake.notify_all()


def write_copy(folder: str, commit: Commit) -> str:
    """Write `commit` as the folder's newest copy (a temporary folder renamed), then delete the older ones."""
    name = copy_name(commit.step)
    final = os.path.join(folder, name)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    os.makedirs(temporary, exist_ok=True)
    commit.state.save(os.path.join(temporary, STATE_FILE))
    with open(os.path.join(temporary, META_FILE), "w", encoding="utf-8") as fh:
        json.dump(dict(commit.meta), fh, default=str)
    if os.path.isdir(final):  # the same step again (a restart's first commit): the newer replaces it
        _remove_tree(final)
    os.rename(temporary, final)
    for other in os.listdir(folder):
        if other != name and (other.startswith("step-") or other.endswith(".tmp")):
            _remove_tree(os.path.join(folder, other))
    return final


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def read_meta(folder: str, name: str) -> dict[str, Any]:
    with open(os.path.join(folder, name, META_FILE), encoding="utf-8") as fh:
        return json.load(fh)


def read_copy(folder: str, name: str) -> Commit:
    path = os.path.join(folder, name, STATE_FILE)
    state = TrainingState.from_file(path)
    return Commit(state, read_meta(folder, name))


@dataclasses.dataclass(frozen=True)
class _Carried:
    """A change of an earlier round, as its record (from the copy's meta)."""

    doc: Mapping[str, Any]

    def as_record(self) -> dict[str, Any]:
        return dict(self.doc)


class PeerCopyState(CountedCommits):
    """ElasticCommit's state (elastic.py): `commit()` every commit_every_steps steps and as the round starts;
    here it writes the host's copy (local rank 0) instead of keeping it in every rank's memory."""

    def __init__(self, run: "PeerCopyRun", committed: Commit | None):
        self.run, self.committed = run, committed
        self.trainer = None

    def commit(self) -> None:
        """Local rank 0: the state copied into memory on the training thread (timed_commit counts it), written
        by the writer's thread. Every rank: the ranges its first windows from here read, pinned on the host."""
        trainer, run = self.trainer, self.run
        step = trainer.loop.step
        run.host_ranges.pin(trainer.data.first_ranges(trainer.cfg.seed, trainer.loop.cursor))
        if run.writer is None:  # not the host's writer: only a fault to inject here
            trainer.faults.in_commit(step)
            return
        if step == run.copied_step:
            return  # the round's start, at the copy it resumed from
        commit = trainer.commit()
        run.writer.submit(Commit(commit.state, dict(commit.meta) | {
            CHANGES_META: [c.as_record() for c in run.changes], "attempt_resumed_from": run.resumed_from}))
        run.copied_step = step


class _Beat(Callback):
    """Local rank 0: the step ended, in the host's beat (peer_copy.BeatFile)."""

    def __init__(self, beat: BeatFile, world_size: int):
        self.beat, self.world_size = beat, world_size

    def on_step_end(self, loop, timing) -> None:
        self.beat.write(timing.step, self.world_size)


class PeerCopyRun:
    """What worker.Trainer reads of an elastic run (as of elastic.ElasticRun): `state.committed` (the copy it
    resumes from, or None: the store's checkpoint), `round`, `resumed_from`, `changes`, `checkpoint_writer`
    (always None: a restarted worker is a new process, and no upload of the one before goes on), `host_ranges`
    (the ranges this rank reads, kept on the host for the workers of the next restart), `restored_alike`."""

    def __init__(self, cfg: JobConfig, start: RankStart, local_rank: int, round_: int):
        self.cfg, self.start, self.round = cfg, start, round_
        self.folder = copy_folder(cfg.run_uri, start.attempt)
        self.writer: CopyWriter | None = None
        self.checkpoint_writer = None
        self.beat: BeatFile | None = None
        self.host_ranges: HostRanges | None = None
        # A commit (state.committed) is always one copy's bytes, read by every rank or broadcast by its holder:
        # every rank restores the same state, and the trainer's broadcast of rank 0's would change nothing
        # (~0.6 s of a restart at the real-size bench's ~300 MB).
        self.restored_alike = True
        if local_rank == 0:
            if round_ == 0:  # the attempt's first start: nothing there can be this attempt's
                remove(self.folder)
            os.makedirs(self.folder, exist_ok=True)
            self.writer, self.beat = CopyWriter(self.folder), BeatFile(self.folder)
        self.local_rank = local_rank
        self.state = PeerCopyState(self, None)
        self.changes: list = []
        self.resumed_from: str | None = None
        self.copied_step: int | None = None
        self.choice: Choice | None = None
        self._pending: dict[str, Any] | None = None

    @classmethod
    def begin(cls, cfg: JobConfig, engine, start: RankStart, environ: Mapping[str, str] = os.environ) -> "PeerCopyRun":
        run = cls(cfg, start, launcher_local_rank(environ), restart_count(environ))
        run.host_ranges = HostRanges(run.folder, engine.rank, WINDOWS_HELD, say)
        if run.round > 0:
            run._resume(engine)
        return run

    def _resume(self, engine) -> None:
        """A restarted round: the newest state there is, agreed by every rank (a collective)."""
        started = time.time()
        mine: dict[str, Any] = {"copy": -1, "done": False, "beat": None, "host": socket.gethostname(), "store": None}
        if self.local_rank == 0:
            newest = newest_copy(os.listdir(self.folder))
            if newest is not None:
                mine["copy"], mine["name"] = newest
                mine["done"] = int(read_meta(self.folder, newest[1]).get("epoch", 0)) >= self.cfg.epochs
            beat = self.beat.read()
            mine["beat"] = dataclasses.astuple(beat) if beat is not None else None
        if engine.rank == 0:
            mine["store"] = self._store_step()
        every: list[Any] = [None] * engine.size
        dist.all_gather_object(every, mine)
        store_step = every[0]["store"]
        choice = self.choice = choose([m["copy"] for m in every], store_step, [m["done"] for m in every])
        beats = [tuple(m["beat"]) for m in every if m["beat"] is not None]
        last_step = max((b[0] for b in beats), default=None)
        commit = None
        if choice.source is Source.PEER_COPY:
            holder = every[choice.holder]
            if same_host_only([m["host"] for m in every], choice.holder):
                commit = read_copy(self.folder, holder["name"])
            else:
                box = [read_copy(self.folder, holder["name"]) if engine.rank == choice.holder else None]
                dist.broadcast_object_list(box, src=choice.holder)
                commit = box[0]
            self.state.committed = commit
            self.copied_step = commit.step
            self.changes = [_Carried(c) for c in commit.meta.get(CHANGES_META, ())]
            self.resumed_from = commit.meta.get("attempt_resumed_from")
        went_to = choice.step if choice.source is Source.PEER_COPY else store_step
        self._pending = {
            "why": LEFT, "detail": f"a worker failed; torchrun restarted every worker (restart {self.round})",
            "from_world_size": max((b[2] for b in beats), default=engine.size),
            "commit_step": went_to,
            "steps_redone": max(last_step - (went_to or 0), 0) if last_step is not None else 0,
            "failed_at": max((b[1] for b in beats), default=started), "rank0_changed": True}
        if engine.rank == 0:
            where = (f"the peer copy of step {choice.step} on {holder['host']} ({self.folder})"
                     if choice.source is Source.PEER_COPY else
                     f"the store's checkpoint of step {store_step}" if store_step is not None else "the start")
            newest_copy_step = max((m["copy"] for m in every), default=-1)
            say(f"torchrun restarted the workers (restart {self.round}): resuming from {where}; the store's "
                f"newest checkpoint is step {store_step}, the newest peer copy step "
                f"{newest_copy_step if newest_copy_step >= 0 else None} (chosen in {time.time() - started:.2f}s)")

    def _store_step(self) -> int | None:
        """The step of the run folder's newest published checkpoint (its name: nothing is read but the list)."""
        folder = RunFolder(self.start.run_store)

        def newest(_moved):
            names = older_than(folder.checkpoints().names(), self.cfg.resume_before_step)
            return max((step_of(n) for n in names), default=None)

        return store_call(self.start.liveness.progress, "list of the newest checkpoint", self.start.run_store,
                          newest)

    def attach(self, trainer) -> None:
        """The round's trainer is made: its commits write this host's copy; the change is recorded after its
        first step."""
        self.state.trainer = trainer
        if self.state.committed is None:  # resumed from the store (or the start): what the attempt resumed from
            self.resumed_from = trainer.resumed_from
        if self.beat is not None:
            trainer.callbacks.append(_Beat(self.beat, trainer.size))
        if self._pending is not None:
            seen, self._pending = self._pending, None
            trainer.elastic_commit.on_first_step(lambda: self._recovered(trainer, seen))

    def _recovered(self, trainer, seen: dict[str, Any]) -> None:
        record_change(self.changes, trainer, seen, data_from_host_bytes=self.host_ranges.hit_bytes)


def run(cfg: JobConfig, make_trainer, device_memory=None) -> int:
    """An elastic DDP rank from its start to its exit code (run_rank's wrapping, as a plain DDP rank's)."""
    from .engines import start_engine
    from .rank_run import run_rank

    started: list[RankStart] = []

    def write_records() -> None:
        # The failure's path and SIGTERM's thread may both get here, and a verdict's end may be writing the
        # result (RankRun.write_result): each waits for the one before it; a second close writes only what is new.
        with ENDING:
            if started and started[0].health_log is not None:
                started[0].health_log.close()

    def trainer(cfg, engine, start):
        started.append(start)
        # A survivor of a death whose collective did not fail is stopped by torchrun with SIGTERM: rank 0's
        # unwritten health records go first (last_word.py).
        on_sigterm(write_records, lambda line: say(f"rank {engine.rank}: {line}"))
        peers = PeerCopyRun.begin(cfg, engine, start)
        made = make_trainer(cfg, engine, start, peers)
        peers.attach(made)
        return made

    folder = copy_folder(cfg.run_uri, os.environ.get(ATTEMPT_ENV, ""))
    ended = read_end(folder) if restart_count() > 0 else None
    if ended is not None:  # a rank ended the job on purpose: torchrun's restart does not undo it
        say(f"a rank ended this job with exit code {ended} before torchrun restarted it: ending with it")
        return ended
    try:
        code = run_rank(cfg, start_engine, trainer, device_memory=device_memory)
    except Exception as exc:
        # A survivor whose collective failed with the dead peer (Gloo: the connection closed) ends with that
        # error, as does a rank that failed on its own, and torchrun restarts every worker: rank 0's unwritten
        # health records go first.
        say(f"this rank failed ({type(exc).__name__}; a collective's when a peer is gone): writing the health "
            "records not yet written before torchrun restarts every worker")
        within(SIGTERM_WORD_SECONDS, write_records)
        raise
    if code != 0:
        write_end(folder, code)
    return code

