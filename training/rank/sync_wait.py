"""Waiting for Horovod's in-flight all-reduces without burning a core.

horovod.torch's synchronize() waits in a loop that yields but never sleeps, so the waiting rank keeps a
core busy. When ranks share a few cores (2 ranks on a 2-core host, or CPU pods with tight limits), that
spinning takes CPU from the Horovod background threads doing the actual all-reduce and from the other
rank's backward pass. Sleeping between polls gives it back; bench/throughput.py measures the difference.
"""
from __future__ import annotations

import time


def wait_for_allreduce(hvd, optimizer, pause_seconds: float = 1e-4) -> None:
    """Return once every gradient all-reduce the DistributedOptimizer has started is done, so the
    synchronize() that follows finds nothing left to wait for."""
    # _handles is horovod.torch's own map of parameter -> (handle, ctx); a handle is an int once started.
    pending = [h for h, _ in getattr(optimizer, "_handles", {}).values() if isinstance(h, int)]
    while pending:
        pending = [h for h in pending if not hvd.poll(h)]
        if pending:
            time.sleep(pause_seconds)
