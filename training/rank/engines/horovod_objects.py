"""A Python object broadcast between Horovod ranks, pickled as hvd.broadcast_object does, without its copy byte by
byte: Horovod builds the pickle's tensor with torch.ByteTensor(bytearray(...)), one Python int a byte (1.3 s per
10 MB on this 2-core host under load, and gigabytes of memory for a large state). At a user's size (25 M
parameters: Adam's state 200 MB, an elastic commit 300 MB) that was most of an elastic recovery's 46 s
(bench/results/elastic_recovery_real_size-before_broadcast_fix.md; 7.7 s without it) and part of every resumed
start; here the pickle's bytes are the tensor (torch.frombuffer), the same bytes moved.
"""
from __future__ import annotations

from typing import Any

import cloudpickle
import torch


# The most bytes one broadcast moves: a 300 MB elastic commit goes in 19 messages, each 0.13 s on a 1 Gb/s link,
# well within the 3 s a collective waits by default (ElasticConfig.peer_timeout_seconds).
CHUNK_BYTES = 16 * 1024 * 1024


def as_tensor(obj: Any) -> torch.Tensor:
    """obj pickled (cloudpickle, as Horovod does), as a uint8 tensor over the pickle's own bytes."""
    return torch.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=torch.uint8)


def from_tensor(tensor: torch.Tensor) -> Any:
    """The object as_tensor pickled."""
    return cloudpickle.loads(tensor.numpy().data)


def broadcast_object(hvd, obj: Any, root_rank: int, name: str) -> Any:
    """hvd.broadcast_object(obj, root_rank, name): root_rank's `obj` on every rank (the root's own object there, as
    Horovod returns it); a collective, so every rank calls it, in the same order. Alone (size 1), the object
    itself, unpickled: an elastic survivor left alone syncs its own 300 MB commit at a user's size (0.5 s)."""
    if hvd.size() == 1:
        return obj
    if hvd.rank() == root_rank:
        tensor = as_tensor(obj)
        size = torch.tensor([tensor.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    hvd.broadcast_(size, root_rank, name=f"{name}.sz")
    if hvd.rank() != root_rank:
        tensor = torch.empty(int(size[0]), dtype=torch.uint8)
    # In pieces of CHUNK_BYTES, one after the other (broadcast_ returns once done, so Horovod fuses none): each
    # is one message, which must arrive within Gloo's timeout on a silent peer (elastic.peer_timeout_seconds).
    for index, start in enumerate(range(0, max(tensor.numel(), 1), CHUNK_BYTES)):
        hvd.broadcast_(tensor[start:start + CHUNK_BYTES], root_rank, name=f"{name}.t{index}")
    return obj if hvd.rank() == root_rank else from_tensor(tensor)
