"""`state.pt`, the training state inside a checkpoint: model, optimizer, data cursor, step, RNG.

It holds tensors and plain data only (dicts, lists, tuples, numbers, strings), so it loads with
`torch.load(weights_only=True)`: the unpickler builds tensors and containers and nothing else. A checkpoint
comes from a bucket, and the sha256 manifest beside it is in the same bucket, so anyone who can write the
bucket could otherwise plant a pickle that runs code on every worker and on the Airflow worker that evaluates
it. Anything richer than plain data (model config, schema, world size) goes in the checkpoint manifest's JSON
`meta`, never in here.

Its tensors are CPU tensors whatever device trained them, and it loads with map_location="cpu": a run
trained on GPUs resumes on CPUs (or other GPUs) and the other way round; the optimizer moves its state to
its parameters' device when it loads it.
"""
from __future__ import annotations

import dataclasses
import io
import pickle
from typing import Any, ClassVar

import torch

from ..formats.checkpoint import CheckpointCorrupt
from .partition_batches import Cursor

STATE_FILE = "state.pt"


class UnsafeCheckpoint(CheckpointCorrupt):
    """state.pt holds something other than tensors and plain data: refused, nothing in it was run. A kind of
    corrupt checkpoint: a resume skips it for the newest one that is safe (checkpoint.first_loadable)."""


@dataclasses.dataclass(frozen=True)
class TrainingState:
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    cursor: tuple[int, int]  # (epoch, next micro-batch of the rank's run of `remaining`'s deal)
    step: int
    torch_rng: torch.Tensor
    # fp16's loss scaling (torch.amp.GradScaler.state_dict(): numbers only), so a resumed fp16 run goes on
    # with the scale it had reached instead of overflowing its way down from 65536 again; None otherwise.
    grad_scaler: dict[str, Any] | None = None
    # Under local SGD (ddp.local_sgd) every rank's optimizer state, in rank order: each rank keeps its own
    # momentum or moments, and a resume gives each its own back; None where rank 0's is every rank's.
    replica_optimizers: list[dict[str, Any]] | None = None
    # The global cursor (partition_batches.Cursor.remaining): the stream positions of the epoch still unseen,
    # as [start, stop) pairs; None: the whole epoch.
    remaining: tuple[tuple[int, int], ...] | None = None
    # Its file in a checkpoint (the background writer names it so: checkpoint_writer.py).
    file_name: ClassVar[str] = STATE_FILE

    def _doc(self) -> dict[str, Any]:
        doc = {"model": self.model, "optimizer": self.optimizer, "cursor": list(self.cursor), "step": self.step,
               "torch_rng": self.torch_rng}
        if self.grad_scaler is not None:
            doc["grad_scaler"] = self.grad_scaler
        if self.replica_optimizers is not None:
            doc["replica_optimizers"] = list(self.replica_optimizers)
        if self.remaining is not None:
            doc["remaining"] = [list(pair) for pair in self.remaining]
        return doc

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save(on_cpu(self._doc()), buf)
        return buf.getvalue()

    def save(self, path: str) -> None:
        """Serialise to a file: what the background checkpoint writer uploads (host_copy made it CPU-only).
        Without the zip format's CRC32 of every record (about a third of torch.save's CPU time on a 300 MB
        state, bench/results/checkpoint_profile.md): the checkpoint's manifest holds the file's sha256,
        checked on every load (checkpoint.py), which a CRC would only repeat."""
        crc32 = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            torch.save(on_cpu(self._doc()), path)
        finally:
            torch.serialization.set_crc32_options(crc32)

    def host_copy(self, pin_memory: bool = False, into: "TrainingState | None" = None) -> "TrainingState":
        """This state with every tensor copied to host memory (pinned on a GPU host, so the copy runs
        without blocking), sharing nothing with the live model and optimizer: the snapshot an asynchronous
        checkpoint writes while training goes on and changes the originals in place.
        into: an earlier snapshot nobody reads any more; its tensors are copied into where they fit (same
        place, shape and dtype) instead of new memory (see host_copy())."""
        copied = host_copy(self._doc(), pin_memory, into._doc() if into is not None else None)
        if pin_memory and torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking copies have landed before the writer reads them
        return dataclasses.replace(self, model=copied["model"], optimizer=copied["optimizer"],
                                   torch_rng=copied["torch_rng"], grad_scaler=copied.get("grad_scaler"),
                                   replica_optimizers=copied.get("replica_optimizers"))

    def nonfinite_tensors(self) -> list[str]:
        """The model parameters and optimizer state tensors holding NaN/Inf, by name ("model.fc.weight",
        "optimizer.state.3.exp_avg"): a checkpoint must never hold one, whether health checks run or not."""
        found: list[str] = []
        _nonfinite(self.model, "model", found)
        _nonfinite(self.optimizer, "optimizer", found)
        for rank, state in enumerate(self.replica_optimizers or ()):
            _nonfinite(state, f"replica_optimizers.{rank}", found)
        return found

    @property
    def resume_cursor(self) -> Cursor:
        """Where a run resumed from this state goes on."""
        return Cursor(*self.cursor, self.remaining)

    @classmethod
    def from_file(cls, path: str) -> "TrainingState":
        """A state from the file at `path`, read once, straight into the tensors: a 300 MB state loads in about
        half the time that reading it into bytes first and loading those takes."""
        return cls._from_doc(load_plain(path, path), path)

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "TrainingState":
        """A state from its serialized bytes; `where` names it in errors."""
        return cls._from_doc(load_plain(data, where), where)

    @classmethod
    def _from_doc(cls, doc: dict[str, Any], where: str) -> "TrainingState":
        try:
            epoch, batch = doc["cursor"]
            remaining = doc.get("remaining")
            return cls(model=doc["model"], optimizer=doc["optimizer"], cursor=(int(epoch), int(batch)),
                       step=int(doc["step"]), torch_rng=doc["torch_rng"], grad_scaler=doc.get("grad_scaler"),
                       replica_optimizers=doc.get("replica_optimizers"),
                       remaining=None if remaining is None else tuple((int(a), int(b)) for a, b in remaining))
        except (KeyError, TypeError, ValueError) as exc:
            raise UnsafeCheckpoint(f"{where} is not a ringflow training state ({exc!r}); "
                                   "resume from another checkpoint") from exc


def on_cpu(obj: Any) -> Any:
    """`obj` with every tensor in it (through dicts, lists, tuples) copied to the CPU; CPU tensors as they are.
    A pickled CUDA tensor would unpickle onto the GPU of the same number, wherever it is loaded."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_cpu(v) for v in obj)
    return obj


def host_copy(obj: Any, pin_memory: bool = False, into: Any = None) -> Any:
    """`obj` with every tensor in it (through dicts, lists, tuples) copied to host memory of its own; CPU
    tensors are copied too, since the optimizer changes its state in place while a checkpoint of it is being
    written. `into`: the same structure from an earlier copy; a tensor there of the same shape and dtype (and
    pinned, if asked for) is written over rather than new memory taken. New memory is paid for at first
    touch, page by page: for a 300 MB state that made the copy ~5x slower than writing over pages already
    in use, on the training thread (bench/results/checkpoint_profile.md)."""
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach()
        if (isinstance(into, torch.Tensor) and into.shape == tensor.shape and into.dtype == tensor.dtype
                and into.device.type == "cpu" and (not pin_memory or into.is_pinned())):
            return into.copy_(tensor, non_blocking=pin_memory and tensor.device.type != "cpu")
        if tensor.device.type == "cpu":
            return tensor.clone()
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin_memory)
        return out.copy_(tensor, non_blocking=pin_memory)
    if isinstance(obj, dict):
        spare = into if isinstance(into, dict) else {}
        return {k: host_copy(v, pin_memory, spare.get(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        spare = into if isinstance(into, (list, tuple)) and len(into) == len(obj) else [None] * len(obj)
        return type(obj)(host_copy(v, pin_memory, s) for v, s in zip(obj, spare))
    return obj


def _nonfinite(obj: Any, path: str, found: list[str]) -> None:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.numel() and not all_finite(obj):
            found.append(path)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _nonfinite(v, f"{path}.{k}", found)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _nonfinite(v, f"{path}.{i}", found)


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every element is finite. The sum first: one read of the tensor, nothing allocated, and a NaN
    or Inf anywhere makes it non-finite; only a sum that overflowed (or a real NaN/Inf) is checked element
    by element. torch.isfinite(t).all() writes a mask as large as the tensor: on a 300 MB state it was the
    largest part of the checkpoint writer's CPU time, ~15x this (bench/results/checkpoint_profile.md)."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def what_was_refused(exc: BaseException) -> str:
    """torch's words for what the unpickler refused ("unsupported GLOBAL posix.system ..."), without its hint
    to load the file again with weights_only=False: that would run the planted code."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "weights_only" not in line and "Weights only" not in line
             and "torch.load" not in line]
    return (named[0] if named else "an object the unpickler does not allow")[:200]


def load_plain(data: bytes | str, where: str) -> dict[str, Any]:
    """Unpickle `data` (bytes, or a file's path) allowing tensors and plain data only; anything else is
    refused before it runs."""
    try:
        doc = torch.load(data if isinstance(data, str) else io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(
            f"refused to load {where}: it holds objects other than tensors and plain data, which could run "
            f"code when unpickled; nothing in it was run ({what_was_refused(exc)}). Someone or something other "
            f"than ringflow wrote it: check who can write the bucket, then delete that checkpoint; a resume "
            f"skips it for the newest safe one") from None
    if not isinstance(doc, dict):
        raise UnsafeCheckpoint(f"{where} holds a {type(doc).__name__}, not a training state; resume from another checkpoint")
    return doc
