"""Every rank's health row of a script's step, gathered where the script's own collectives allow: through
torch.distributed when the script initialized a process group (DDP), through Horovod when it called hvd.init();
otherwise (TensorFlow's MultiWorkerMirroredStrategy, a script with no collectives) each rank has its own row
only. Every rank must call report() the same number of times (as Ray Train's report asks): the gather is a
collective."""
from __future__ import annotations

import sys
from typing import Callable

Row = list[float]


def gatherer() -> Callable[[Row], list[Row]] | None:
    """How to gather rows in this process now, or None when no collective library is initialized."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return TorchRows(dist)
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        import torch

        def via_horovod(row: Row) -> list[Row]:
            gathered = hvd.allgather(torch.tensor([row], dtype=torch.float64), name="ringflow.report")
            return gathered.tolist()

        return via_horovod
    return None


class TorchRows:
    """Rows gathered with torch.distributed's all_gather on a Gloo group of ringflow's own, made by the first
    gather (every rank reports the same steps, so every rank makes it at the same point of its collectives).

    Why not the script's default group: Gloo's worker thread lets go of a finished collective's tensors a moment
    after the caller has its result, and letting go of a tensor Python made takes the GIL. When a script ends,
    its DDP model is freed (its module's or function's scope closes) and the DDP reducer destroys the process
    group it holds while keeping the GIL (pytorch/pytorch#56297): it joins that group's worker threads, one of
    which waits for the GIL to let go of the last report's gather. Neither goes on, and the rank hung after
    its last report (seen in CI; made to happen within 2 rounds of init, DDP, gather, free). The reducer
    never destroys this group, whose threads then always get the GIL."""

    def __init__(self, dist):
        import torch

        self._torch, self._dist = torch, dist
        self._group = dist.new_group(backend="gloo")
        self._size = dist.get_world_size(self._group)

    def __call__(self, row: Row) -> list[Row]:
        mine = self._torch.tensor(row, dtype=self._torch.float64)
        rows = [self._torch.zeros_like(mine) for _ in range(self._size)]
        self._dist.all_gather(rows, mine, group=self._group)
        return [r.tolist() for r in rows]
