"""TF_CONFIG: what tells each TensorFlow worker who the job's workers are and which one it is.

`tf.distribute.MultiWorkerMirroredStrategy` reads it once, when the strategy is made: the cluster's worker
addresses ("host:port", in task-index order, the same list for every worker) and this process's task. Every
worker is a "worker" (no "chief" task): worker 0 does the chief's work, as the cluster resolver takes
worker 0 to be the chief when there is none, and ringflow's rank 0 is task index 0.

One pure function, shared by every backend that starts TensorFlow workers: the local launcher (127.0.0.1
ports it chose, core/launcher.py) and the Kubernetes one (the pods' headless-service names).
Torch-free, TensorFlow-free.
"""
from __future__ import annotations

from typing import Any

# The environment variable TensorFlow's cluster resolver reads.
TF_CONFIG_ENV = "TF_CONFIG"


def tf_config(worker_hosts: list[str], index: int) -> dict[str, Any]:
    """Worker `index`'s TF_CONFIG for a job of `worker_hosts` ("host:port" each, in task-index order)."""
    if not worker_hosts:
        raise ValueError("no worker hosts: a TensorFlow job needs at least one worker address (host:port)")
    for host in worker_hosts:
        name, sep, port = str(host).rpartition(":")
        if not (sep and name and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"worker address {host!r} is not host:port; give each worker as e.g. 127.0.0.1:23456")
    if len(set(worker_hosts)) != len(worker_hosts):
        raise ValueError(f"worker addresses {worker_hosts} repeat one; every worker needs its own host:port")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(worker_hosts):
        raise ValueError(f"worker index {index!r} is not one of the {len(worker_hosts)} workers; "
                         f"use 0..{len(worker_hosts) - 1}")
    return {"cluster": {"worker": list(worker_hosts)}, "task": {"type": "worker", "index": index}}
