"""Where a rank computes and in what precision: its local GPU when the host has one, else the CPU.

`choose_placement` is the one decision, a pure function of what the rank sees (how many GPUs, its local
rank, the engine, the config's precision); the engines call it at start (engines/ddp.py before the process
group, engines/horovod.py after hvd.init, which is where Horovod's local rank is known) and keep the
answer as `engine.placement`. The worker moves the model there, PartitionData moves each batch there
(from pinned host memory, non-blocking), and `Precision` applies the precision: autocast around the
model's forward and, for fp16, a GradScaler whose unscale and step the engines call around the all-reduce.

Checkpoints stay device-independent whatever runs here: state.pt holds CPU tensors (training_state.py)
and loads with map_location="cpu", so a run trained on GPUs resumes on CPUs and the other way round.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

from ..formats.config import PRECISIONS, ConfigError
from ..formats.engines import DDP, ENGINES

# autocast's dtype for each precision; fp32 runs without autocast.
AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


class PlacementError(RuntimeError):
    """This rank cannot run where the host puts it; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Placement:
    device: str                       # "cpu" or "cuda:<local rank>"
    process_group: str | None         # torch.distributed backend (engine "ddp"); Horovod brings its own
    autocast_dtype: str | None        # a torch dtype name, None for fp32
    grad_scaler: bool                 # fp16: scale the loss's gradient so small ones survive float16
    pin_memory: bool                  # batches wait in page-locked host memory for an asynchronous copy

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]


def choose_placement(cuda_devices: int, local_rank: int, engine: str, precision: str,
                     horovod_nccl: bool = True) -> Placement:
    """The device, process-group backend and precision of one rank.

    cuda_devices: GPUs this process sees (torch.cuda.device_count(); 0 without CUDA or with
    CUDA_VISIBLE_DEVICES=""). local_rank: the rank's index on its host (torchrun's LOCAL_RANK,
    hvd.local_rank()). horovod_nccl: whether Horovod was built with NCCL (hvd.nccl_built()), which it needs
    to all-reduce GPU tensors."""
    if engine not in ENGINES:
        raise ConfigError("engine", f"is {engine!r}", f"use one of {ENGINES}")
    if precision not in PRECISIONS:
        raise ConfigError("precision", f"is {precision!r}", f"use one of {PRECISIONS}")
    if local_rank < 0:
        raise PlacementError(f"local rank {local_rank}: the launcher gave this rank no valid LOCAL_RANK")
    if cuda_devices <= 0:
        if precision == "fp16":
            raise ConfigError("precision", "is 'fp16' but this rank has no GPU",
                              'use "bf16" (CPU autocast) or "fp32" on CPU; fp16 needs a CUDA GPU for its loss scaling')
        return Placement("cpu", "gloo" if engine == DDP else None, AUTOCAST_DTYPES.get(precision), False, False)
    if local_rank >= cuda_devices:
        raise PlacementError(
            f"local rank {local_rank} on a host whose ranks see {cuda_devices} GPU(s): one rank per GPU, so start "
            f"at most {cuda_devices} ranks per host (--np, torchrun's --nproc-per-node, the MPIJob's slots per "
            f"worker), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU")
    if engine == "horovod" and not horovod_nccl:
        raise PlacementError(
            "this host has a GPU but Horovod was built without NCCL, so it cannot all-reduce GPU tensors: use "
            "the GPU training image (docker/training.Dockerfile with --build-arg GPU=1, which builds Horovod "
            "with HOROVOD_GPU_OPERATIONS=NCCL), the ddp engine, or hide the GPUs (CUDA_VISIBLE_DEVICES=) to "
            "train on the CPU")
    # DDP on a GPU: NCCL for the gradients, Gloo still for CPU tensors (the health monitor's small gathers).
    return Placement(f"cuda:{local_rank}", "cpu:gloo,cuda:nccl" if engine == DDP else None,
                     AUTOCAST_DTYPES.get(precision), precision == "fp16", True)


def place_rank(engine: str, precision: str, local_rank: int, horovod_nccl: bool = True) -> Placement:
    """choose_placement for this process, and its GPU made the current device (before any collective, so
    NCCL and every `cuda` tensor land on the rank's own GPU)."""
    placement = choose_placement(torch.cuda.device_count() if torch.cuda.is_available() else 0, local_rank,
                                 engine, precision, horovod_nccl)
    if placement.cuda:
        torch.cuda.set_device(torch.device(placement.device))
    return placement


def to_device(tensor: torch.Tensor, placement: Placement) -> torch.Tensor:
    """A batch on the rank's device; from pinned memory the copy is asynchronous (ordered on the current
    stream before the forward that reads it)."""
    if not placement.cuda:
        return tensor
    return tensor.to(placement.device, non_blocking=tensor.is_pinned())


class Precision:
    """The config's precision on a placement: autocast around the model's forward, and for fp16 a
    GradScaler. The gradients are scaled where the model's output meets the loss (a hook on the output's
    gradient, the same as scaling the loss), so the loop, its loss records and the health monitor see the
    true loss; the engine unscales after the all-reduce (`unscale`), so the health monitor measures the
    true gradient, and steps through the scaler (`step`), which skips a step whose gradient overflowed."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.scaler = torch.amp.GradScaler(placement.device_type) if placement.grad_scaler else None
        self.skipped_steps = 0  # fp16 steps whose scaled gradient overflowed (skipped, scale lowered)

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Run `model`'s forward under autocast (the same module: its state_dict keys do not change, so
        checkpoints are the same for every precision). Floating outputs come back as float32, so the loss
        is computed in full precision."""
        dtype = self.placement.autocast_dtype
        if dtype is None:
            return model
        # An instance attribute shadows the class's forward; nn.Module.__call__ (and DDP) call it.
        model.forward = _autocast(model.forward, self.placement.device_type, getattr(torch, dtype), self.scaler)
        return model

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """After the all-reduce: the true averaged gradient in .grad. A step whose scaled gradient overflowed
        is skipped by `step`; its gradient is zeroed here, so the health monitor does not judge the
        overflow the scaler handles as a NaN/Inf in training (a non-finite loss still is one)."""
        if self.scaler is None:
            return
        self.scaler.unscale_(optimizer)
        # What unscale_ found, as GradScaler.step reads it (one flag per device): not a second pass over the
        # gradients. A private field, checked by tests/training/rank/test_devices.py on the torch pinned here.
        found_inf = self.scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values()
        if sum(float(flag) for flag in found_inf):
            self.skipped_steps += 1
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.zero_()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)  # skipped when unscale_ found an Inf/NaN
        self.scaler.update()


def _autocast(forward: Callable, device_type: str, dtype: torch.dtype,
              scaler: "torch.amp.GradScaler | None") -> Callable:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            out = forward(*args, **kwargs)
        return _full_precision(out, scaler)

    return run


def _full_precision(out: Any, scaler: "torch.amp.GradScaler | None") -> Any:
    if isinstance(out, torch.Tensor):
        if out.is_floating_point():
            out = out.float()
            if scaler is not None and out.requires_grad:
                out.register_hook(scaler.scale)
        return out
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # a namedtuple
        return type(out)(*(_full_precision(o, scaler) for o in out))
    if isinstance(out, (list, tuple)):
        return type(out)(_full_precision(o, scaler) for o in out)
    if isinstance(out, dict):
        return {k: _full_precision(v, scaler) for k, v in out.items()}
    return out
