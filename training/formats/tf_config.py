"""The TF_CONFIG of one TensorFlow worker: the whole cluster's worker addresses and which of them it is.

tf.distribute.MultiWorkerMirroredStrategy reads it from the environment (TFConfigClusterResolver). ringflow
writes it for every worker, the same way wherever the worker runs: the local launcher with 127.0.0.1 ports
it chose, a TrainJob pod with the JobSet's headless-service names (core/backends/kubernetes/tf_pod.py).
Every worker gets the same list, in the same order, so index i means the same process to all of them.
No TensorFlow here: a pure function over plain values.
"""
from __future__ import annotations

import json
from typing import Any

# The environment variable TensorFlow reads.
TF_CONFIG_ENV = "TF_CONFIG"
# The rank variables torchrun gives its ranks, given to TensorFlow workers too: the rank reads its rank and the
# job's size before TensorFlow starts (liveness, rank 0's last word: rank/worker_env.py), and its place among
# its host's workers to size its threads (rank/engines/tensorflow.py).
RANK_ENV, WORLD_SIZE_ENV, LOCAL_RANK_ENV, LOCAL_WORLD_SIZE_ENV = "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"
# The local pair, as the ranks read it (rank/cores.local_rank_from_env: pairs of launcher variables).
LOCAL_PLACE_ENV = ((LOCAL_RANK_ENV, LOCAL_WORLD_SIZE_ENV),)
WORKER_ENV = (TF_CONFIG_ENV, RANK_ENV, WORLD_SIZE_ENV, LOCAL_RANK_ENV, LOCAL_WORLD_SIZE_ENV)


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


def tf_worker_env(worker_hosts: list[str], index: int, local_rank: int, local_size: int) -> dict[str, str]:
    """Everything ringflow gives TensorFlow worker `index` of `worker_hosts`, wherever it runs: its TF_CONFIG and
    the rank variables (WORKER_ENV). `local_rank` of `local_size`: its place among the workers of its host (a
    local job: all of them; a pod: 0 of 1)."""
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local_rank {local_rank} of {local_size}: give the worker's place among its host's workers")
    return {TF_CONFIG_ENV: json.dumps(tf_config(worker_hosts, index)), RANK_ENV: str(index),
            WORLD_SIZE_ENV: str(len(worker_hosts)), LOCAL_RANK_ENV: str(local_rank),
            LOCAL_WORLD_SIZE_ENV: str(local_size)}
