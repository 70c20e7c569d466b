"""The PyTorch DDP engine: a torch.distributed process group, DistributedDataParallel, and a communication
hook that times the gradient all-reduce.

Started by torchrun (launcher.py: c10d rendezvous), which gives each rank RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. The ranks train exactly as under Horovod: the same
partitions in the same order, the learning rate scaled by the world size (worker.make_optimizer), rank 0
alone writes, the same health records; checkpoints hold the user's module (`unwrap`), so their keys are
the same as Horovod's and a run resumes under either engine.

With ddp.local_sgd the ranks step their own replicas after a warm-up and average parameters every H steps
instead of gradients every step (local_sgd.py); the learning rate is scaled by the world size all the same.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ...formats.config import DdpConfig, JobConfig
from ...formats.engines import DDP
from ...formats.tf_config import LOCAL_PLACE_ENV, RANK_ENV, WORLD_SIZE_ENV
from ..cores import claim_cpu_share, local_rank_from_env
from ..devices import Placement, place_rank
from ..engine import Engine, share_host_cores
from .local_sgd import LocalSgd
from ..training_state import on_cpu

# What torchrun sets for every rank; without them there is no process group to join.
TORCHRUN_ENV = (RANK_ENV, WORLD_SIZE_ENV, "MASTER_ADDR", "MASTER_PORT")


class SyncClock:
    """A DDP communication hook around the default all-reduce that notes, for each bucket, when its
    all-reduce was launched (its gradients were ready) and when it finished.

    DDP waits for the buckets at the end of backward, so the wait is inside loss.backward(), where the loop
    cannot see it. `take` gives what Horovod's synchronize() measures: the time from the last bucket's
    launch (backward's compute done) until every bucket was reduced, the all-reduce not hidden behind
    backward, waiting for slower peers included."""

    def __init__(self) -> None:
        self._spans: list[tuple[float, float]] = []

    def hook(self, process_group, bucket):  # unannotated: DDP rejects annotations it cannot resolve
        launched = time.perf_counter()
        # default_hooks.allreduce_hook's all-reduce (the mean of the bucket), with one callback, not two
        # chained: the hook runs every step, and its Python is what DDP's own C++ path does not pay.
        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer().div_(group.size())

        def finished(fut: torch.futures.Future) -> torch.Tensor:
            # Runs on the thread that completed the all-reduce; DDP waits for this future, so every span
            # is noted before backward returns.
            self.note(launched)
            return fut.value()[0]

        return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(finished)

    def note(self, launched: float) -> None:
        """A bucket's all-reduce, launched at `launched`, finished now."""
        self._spans.append((launched, time.perf_counter()))

    def take(self) -> float:
        """The exposed all-reduce time of the buckets noted since the last call; 0.0 when none ran."""
        spans, self._spans = self._spans, []
        if not spans:
            return 0.0
        return max(max(done for _, done in spans) - max(launched for launched, _ in spans), 0.0)


class AccumulatingDDP(DistributedDataParallel):
    """DistributedDataParallel that all-reduces on every k-th forward and backward only: the passes in
    between run under no_sync(), so their gradients add up locally. DDP decides in forward whether the
    backward that follows syncs, and the loop runs exactly one backward per forward from a step boundary
    (a resumed run too: checkpoints are taken between steps), so counting forwards is counting passes."""

    def __init__(self, module: torch.nn.Module, accumulation_steps: int, **kwargs: Any):
        super().__init__(module, **kwargs)
        self.accumulation_steps = accumulation_steps
        self._passes = 0
        self.sync_next = False  # the next pass ends its step early (the run's last step: end_step_early)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.accumulation_steps == 1 or not (self.training and torch.is_grad_enabled()):
            return super().forward(*args, **kwargs)
        self._passes += 1
        if self._passes % self.accumulation_steps == 0 or self.sync_next:
            self._passes, self.sync_next = 0, False
            return super().forward(*args, **kwargs)
        with self.no_sync():
            return super().forward(*args, **kwargs)


class DdpEngine(Engine):
    name = DDP

    def __init__(self, cfg: DdpConfig, rank: int, size: int, placement: Placement | None = None):
        self.cfg, self.rank, self.size = cfg, rank, size
        self._place(placement)  # where this rank computes (devices.py)
        self.accumulation_steps = cfg.backward_passes_per_step
        self.clock = SyncClock()
        # Post-local SGD (ddp.local_sgd, local_sgd.py): ranks step alone and average parameters every H steps.
        self.local_sgd = LocalSgd(cfg.local_sgd, rank, size, self.clock.note) if cfg.local_sgd else None
        self._ddp: AccumulatingDDP | None = None
        self._last_sync = 0.0

    @classmethod
    def start(cls, cfg: JobConfig, environ=os.environ) -> "DdpEngine":
        """Join the process group torchrun set up for this rank."""
        missing = [name for name in TORCHRUN_ENV if name not in environ]
        if missing:
            raise RuntimeError(f"engine 'ddp': this rank has no {', '.join(missing)} in its environment, so it was "
                               f"not started by torchrun; launch the job with `ringflow train CONFIG --engine ddp` "
                               f"(or torchrun -m ringflow.training CONFIG)")
        local_rank, local_size = local_rank_from_env(environ, LOCAL_PLACE_ENV) or (0, 1)
        # Bound before the process group starts Gloo's threads, so they start on the rank's own CPUs.
        share_host_cores(claim_cpu_share(cfg.bind_cores, local_rank, local_size, environ))
        # The rank's GPU is made current before the process group exists, so NCCL binds to it.
        placement = place_rank(cls.name, cfg.precision, local_rank)
        dist.init_process_group(backend=placement.process_group)
        return cls(cfg.ddp, dist.get_rank(), dist.get_world_size(), placement)

    def distribute(self, model, optimizer):
        # bucket_cap_mb: how many MB of gradients one all-reduce carries (the bandwidth knob).
        # A module on one GPU names it (device_ids); on the CPU DDP takes none.
        device_ids = [torch.device(self.placement.device)] if self.placement.cuda else None
        self._ddp = AccumulatingDDP(model, self.accumulation_steps, bucket_cap_mb=self.cfg.bucket_cap_mb,
                                    device_ids=device_ids)
        if self.local_sgd is not None:
            if self.size > 1:
                self._ddp.register_comm_hook(self.local_sgd.state, self.local_sgd.hook)
            return self.local_sgd.wrap(optimizer)  # the user's optimizer step, then the periodic average
        if self.size > 1:
            # One rank has no peer to wait for: DDP's own C++ all-reduce then, not a Python hook per bucket
            # (2 % of a one-rank step, bench/results/throughput.md); its sync time is 0.
            self._ddp.register_comm_hook(None, self.clock.hook)
        return optimizer  # DDP averages the gradients in backward: the optimizer stays the user's

    def replica_schedule(self, start_step, last_step):
        if self.local_sgd is None:
            return super().replica_schedule(start_step, last_step)
        return self.local_sgd.start(start_step, last_step)

    def shared_gradient_norm(self, local_norm: float) -> float:
        # Under local SGD each rank's gradient is its own.
        return local_norm if self.local_sgd is None else self.local_sgd.mean_gradient_norm(local_norm)

    def replica_optimizer_states(self, optimizer):
        return None if self.local_sgd is None else self.local_sgd.gather_optimizer_states(optimizer)

    def restore_replica_optimizer(self, optimizer, states) -> None:
        if self.local_sgd is not None:
            self.local_sgd.restore_optimizer_state(optimizer, states)

    def training_model(self, model):
        if self._ddp is None or self._ddp.module is not model:
            raise RuntimeError("DdpEngine.training_model: call distribute(model, optimizer) with this model first")
        return self._ddp

    def unwrap(self, model):
        return model.module if isinstance(model, DistributedDataParallel) else model

    def broadcast_state(self, model, optimizer) -> None:
        with torch.no_grad():
            for tensor in self.unwrap(model).state_dict().values():  # views of the parameters and buffers
                dist.broadcast(tensor, src=0)
        # Pickled, like Horovod's broadcast_object: every rank gets rank 0's exact values and types.
        # On the CPU: a pickled CUDA tensor would unpickle onto rank 0's GPU on every rank.
        state = [on_cpu(optimizer.state_dict()) if self.rank == 0 else None]
        dist.broadcast_object_list(state, src=0)
        optimizer.load_state_dict(state[0])

    def sync_gradients(self, optimizer) -> None:
        # Nothing left to wait for: DDP's backward returned with the averaged gradients in .grad.
        self._last_sync = self.clock.take()
        self.precision.unscale(optimizer)  # fp16: the true gradient, for the health monitor and the step

    def step_sync_seconds(self, waited: float) -> float:
        return waited + self._last_sync

    def end_step_early(self) -> None:
        # DDP decides in forward whether the backward that follows all-reduces.
        if self._ddp is not None:
            self._ddp.sync_next = True

    def apply_gradients(self, optimizer) -> None:
        self.precision.step(optimizer)
        if self.local_sgd is not None:
            self.local_sgd.after_step(optimizer)

    def allgather(self, tensor, name):
        return self.wait(self.allgather_async(tensor, name))

    def allgather_async(self, tensor, name):
        # Every rank issues the same collectives in the same order, so they pair up without names.
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        return dist.all_gather(parts, tensor.contiguous(), async_op=True), parts

    def wait(self, handle):
        work, parts = handle
        work.wait()
        return torch.cat(parts)

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
