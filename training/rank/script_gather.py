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
        import torch

        def via_torch(row: Row) -> list[Row]:
            mine = torch.tensor(row, dtype=torch.float64)
            rows = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(rows, mine)
            return [r.tolist() for r in rows]

        return via_torch
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        import torch

        def via_horovod(row: Row) -> list[Row]:
            gathered = hvd.allgather(torch.tensor([row], dtype=torch.float64), name="ringflow.report")
            return gathered.tolist()

        return via_horovod
    return None
