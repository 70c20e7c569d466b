"""What the training loop needs from a data-parallel engine.

The loop (loop.py) and its callbacks see only `Engine`: who am I, how many of us, sync the averaged
gradients, apply them, gather small tensors from every rank. Each library's specifics live in its own
engine (engines/horovod.py: hvd.init, the DistributedOptimizer, allgather; engines/ddp.py: a
torch.distributed process group, DistributedDataParallel, a communication hook), so the loop, the health
monitor and the checkpoints are the same whichever runs underneath.
"""
from __future__ import annotations

import abc
from typing import Any

import torch

from .cores import CpuShare
from .devices import Placement, Precision, choose_placement
from ..health.replica_schedule import ReplicaSchedule


class Engine(abc.ABC):
    name: str  # the config's `engine` value that selects it
    rank: int
    size: int
    # Backward passes whose gradients add up before one all-reduce and one optimizer step.
    accumulation_steps: int
    # This rank's device and process-group backend, chosen once when the engine starts (devices.py);
    # the worker puts the model and the batches there.
    placement: Placement
    # Autocast and loss scaling for the config's `precision`, on `placement`.
    precision: Precision

    def _place(self, placement: Placement | None) -> None:
        """Set `placement` and `precision`: where start() put this rank, else the CPU in fp32."""
        self.placement = placement or choose_placement(0, 0, self.name, "fp32")
        self.precision = Precision(self.placement)

    @abc.abstractmethod
    def distribute(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer whose gradients are averaged across ranks (before any state is loaded into it)."""

    def training_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the loop runs forward and backward through (after `distribute`). `unwrap` of it is
        `model`: what checkpoints hold, so their keys are the same for every engine."""
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside what `training_model` returned."""
        return model

    @abc.abstractmethod
    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Make rank 0's model and optimizer state every rank's, exactly (on a resume; not where every rank
        restored the same state: an elastic DDP restart's peer copy, worker.Trainer)."""

    @abc.abstractmethod
    def sync_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Return once the averaged gradients are in every parameter's .grad."""

    def step_sync_seconds(self, waited: float) -> float:
        """Seconds this step waited for the gradient all-reduce, given `waited`, the loop's time in
        `sync_gradients`. Horovod waits there; DDP waits inside backward and measures it itself."""
        return waited

    def end_step_early(self) -> None:
        """The next backward pass ends the step with fewer than `accumulation_steps` passes (the run's last
        step): its gradients are synced after it. Horovod needs nothing: its optimizer's synchronize()
        all-reduces every gradient whose delay had not run out yet."""

    @abc.abstractmethod
    def apply_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step on the averaged gradients, without syncing them again."""

    def replica_schedule(self, start_step: int, last_step: int) -> ReplicaSchedule:
        """After which steps every rank's replica agrees (health/replica_schedule.py), for a run going from
        `start_step` (0, or the checkpoint's step) to `last_step`. Synchronous engines: after every step. An
        engine whose ranks step their own replicas sets its step counters to `start_step` here, after the
        optimizer state was restored and broadcast."""
        return ReplicaSchedule(last_step=last_step)

    def shared_gradient_norm(self, local_norm: float) -> float:
        """The gradient norm every rank acts on alike. Synchronous engines: this rank's norm of the averaged
        gradient, already the same on every rank."""
        return local_norm

    def replica_optimizer_states(self, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]] | None:
        """Called by every rank at each checkpoint: on rank 0 each rank's optimizer state, in rank order, where
        the ranks' optimizer states differ (local SGD); None where rank 0's is every rank's."""
        return None

    def restore_replica_optimizer(self, optimizer: torch.optim.Optimizer,
                                  states: list[dict[str, Any]] | None) -> None:
        """After the state is restored (and broadcast) on a resume: this rank's own optimizer state from a checkpoint that kept
        each rank's (`states`), where this engine's ranks keep their own; else rank 0's stays every rank's."""

    @abc.abstractmethod
    def allgather(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Every rank's `tensor`, stacked in rank order along dim 0."""

    @abc.abstractmethod
    def allgather_async(self, tensor: torch.Tensor, name: str) -> Any:
        """Start an allgather; `wait(handle)` returns its result."""

    @abc.abstractmethod
    def wait(self, handle: Any) -> torch.Tensor: ...

    def shutdown(self) -> None:
        """Leave the job's collectives (after result.json is written)."""


def share_host_cores(share: CpuShare) -> None:
    """torch's intra-op threads for this rank's share of the CPUs (cores.py), the same share it is bound to:
    more threads than cores' worth oversubscribe them and make every step slower. Before torch's first
    parallel operation, so its thread pool starts inside the rank's CPUs."""
    torch.set_num_threads(share.threads)
