"""Post-local SGD for the DDP engine (ddp.local_sgd): torch's own pieces, wired into ringflow's loop.

- The gradient hook is torch's post_localSGD_hook with PostLocalSGDState(start_localSGD_iter=W): for the
  first W steps it all-reduces the gradients (timed like the synchronous engine's, SyncClock); after them it
  hands each bucket back untouched, so a rank steps on its own gradients. post_local_gradient_allreduce is
  off: torch's default all-reduces gradients within each host after warm-up (its intra-node subgroup), which
  on one host is every rank, every step, i.e. synchronous training that also averages parameters.
- The optimizer is PostLocalSGDOptimizer(optimizer, PeriodicModelAverager(period=H, warmup_steps=W)): the
  rank's own optimizer step, then every H steps after warm-up an all-reduce of the parameters. Its
  state_dict carries the averager's step ("step"), so checkpoints hold it.
- After the last step the parameters are averaged whatever H divides (health/replica_schedule.py), so the
  model a run ends with, the one evaluated and promoted, is the replicas' average, not rank 0's replica.
- Each rank's optimizer state (momentum, Adam's moments) is its own between and across averages, so a
  checkpoint keeps every rank's (gathered to rank 0) and a resume gives each rank its own back: a resumed
  run goes on exactly as an uninterrupted one (tests/training/test_local_sgd.py).
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import average_parameters_or_parameter_groups
from torch.distributed.optim import PostLocalSGDOptimizer

from ...formats.config import LocalSgdConfig
from ...health.replica_schedule import ReplicaSchedule
from ..callbacks.logging import say
from ..training_state import on_cpu


class LocalSgd:
    def __init__(self, cfg: LocalSgdConfig, rank: int, size: int, note_sync: Callable[[float], None]):
        """note_sync(launched): called when a warm-up all-reduce launched at `launched` finished (SyncClock)."""
        self.cfg, self.rank, self.size, self._note_sync = cfg, rank, size, note_sync
        self.state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=cfg.warmup_steps,
                                       post_local_gradient_allreduce=False)
        self.averager: PeriodicModelAverager | None = None
        self.schedule: ReplicaSchedule | None = None

    def hook(self, state: PostLocalSGDState, bucket):  # unannotated bucket: DDP rejects what it cannot resolve
        if state.iter >= state.start_localSGD_iter:
            return post_localSGD_hook(state, bucket)  # the local gradient as it is: nothing to wait for
        launched = time.perf_counter()

        def finished(fut: torch.futures.Future) -> torch.Tensor:
            self._note_sync(launched)
            return fut.value()

        return post_localSGD_hook(state, bucket).then(finished)

    def wrap(self, optimizer: torch.optim.Optimizer) -> PostLocalSGDOptimizer:
        with warnings.catch_warnings():
            # torch warns that period 1 costs no less than DDP's gradient all-reduce: the benchmark's point.
            warnings.filterwarnings("ignore", message="When period is 1")
            self.averager = PeriodicModelAverager(period=self.cfg.period, warmup_steps=self.cfg.warmup_steps)
        return PostLocalSGDOptimizer(optimizer, self.averager)

    def start(self, start_step: int, last_step: int) -> ReplicaSchedule:
        """Set the averager's and the hook's step counters for a run starting at `start_step`, once the
        optimizer state is restored; the schedule of averages."""
        restored = self.averager.step  # what the optimizer state said (torch's load_state_dict), 0 if nothing
        # The averager counts optimizer steps, as the loop does; a checkpoint of a synchronous run holds no
        # averager step (torch then sets 0): its steps count, so warm-up is not run again.
        self.averager.step = start_step
        # The hook counts the synchronized backward passes up to warm-up's end: one per step.
        self.state.iter = min(start_step, self.cfg.warmup_steps)
        self.schedule = ReplicaSchedule(self.cfg.period, self.cfg.warmup_steps, last_step)
        if self.rank == 0:
            origin = "" if restored == start_step else f" (the checkpoint's optimizer state said {restored})"
            say(f"local SGD: parameters averaged every {self.cfg.period} steps after step {self.cfg.warmup_steps} "
                f"and after the last step ({last_step}); averager at step {start_step}{origin}")
        return self.schedule

    def after_step(self, optimizer: PostLocalSGDOptimizer) -> None:
        """After the optimizer step (and the averager's own average): the last step's average."""
        if self.schedule.forced_average_at(self.averager.step):
            average_parameters_or_parameter_groups(optimizer.param_groups, self.averager.process_group)

    def mean_gradient_norm(self, local_norm: float) -> float:
        """The ranks' mean local gradient norm: every rank acts on the same number (a NaN/Inf anywhere is
        everyone's), as they do on the averaged gradient's under synchronous training."""
        if self.size == 1:
            return local_norm
        total = torch.tensor([local_norm], dtype=torch.float64)
        dist.all_reduce(total)
        return float(total) / self.size

    def gather_optimizer_states(self, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]] | None:
        """Every rank: each rank's optimizer state, in rank order, on rank 0 (None elsewhere)."""
        own = on_cpu(optimizer.state_dict())
        if self.size == 1:
            return [own]
        states: list[Any] | None = [None] * self.size if self.rank == 0 else None
        dist.gather_object(own, states, dst=0)
        return states

    def restore_optimizer_state(self, optimizer: torch.optim.Optimizer, states: list[dict[str, Any]] | None) -> None:
        """This rank's own optimizer state from a checkpoint that kept each rank's."""
        if states is None:
            return  # a checkpoint of a synchronous run: every rank's state was rank 0's, as broadcast
        if len(states) != self.size:
            if self.rank == 0:
                say(f"local SGD: the checkpoint kept the optimizer states of {len(states)} ranks and this run has "
                    f"{self.size}: every rank goes on from rank 0's")
            return
        optimizer.load_state_dict(states[self.rank])
