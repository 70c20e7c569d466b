"""The TF_CONFIG of one TensorFlow worker: the whole cluster's worker addresses and which of them it is.

tf.distribute.MultiWorkerMirroredStrategy reads it from the environment (TFConfigClusterResolver). ringflow
writes it for every worker, the same way wherever the worker runs: the local launcher with 127.0.0.1 ports
it chose, a TrainJob pod with the JobSet's headless-service names (core/backends/kubernetes/tf_pod.py).
Every worker gets the same list, in the same order, so index i means the same process to all of them.
No TensorFlow here: a pure function over plain values.
"""
from __future__ import annotations

from typing import Any

# The environment variable TensorFlow reads.
TF_CONFIG_ENV = "TF_CONFIG"


def tf_config(worker_hosts: list[str], index: int) -> dict[str, Any]:
    """{"cluster": {"worker": worker_hosts}, "task": {"type": "worker", "index": index}}: worker `index` of
    `worker_hosts` ("host:port" each). Only workers, no chief: MultiWorkerMirroredStrategy then makes worker 0
    its chief, which is the rank ringflow's rank 0 already is."""
    hosts = list(worker_hosts)
    if not hosts or not all(isinstance(h, str) and _host_port(h) for h in hosts):
        raise ValueError(f"worker_hosts is {worker_hosts!r}; give one 'host:port' per worker, at least one")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"worker_hosts {hosts!r} names an address twice; give each worker its own host:port")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(hosts):
        raise ValueError(f"index is {index!r}; use the worker's position in worker_hosts, 0 to {len(hosts) - 1}")
    return {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}


def _host_port(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(host) and bool(sep) and port.isdigit() and 0 < int(port) < 65536
