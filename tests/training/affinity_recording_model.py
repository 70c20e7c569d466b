"""A model factory that records, per rank, the CPUs every thread of its process may run on (the kernel's
Cpus_allowed_list, not ringflow's own reading of it) and torch's thread count, once the engine has started
(read by test_bind_cores_jobs.py; imported by the ranks through PYTHONPATH)."""
import json
import os

import torch

LOCAL_RANK_ENV = ("OMPI_COMM_WORLD_LOCAL_RANK", "HOROVOD_LOCAL_RANK", "LOCAL_RANK")


def cpus_allowed(tid: str) -> list[int]:
    with open(f"/proc/self/task/{tid}/status") as status:
        text = next(line for line in status if line.startswith("Cpus_allowed_list:")).split(":", 1)[1].strip()
    cpus = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


def build(num_features, num_outputs, task, out):
    local_rank = next(os.environ[name] for name in LOCAL_RANK_ENV if name in os.environ)
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            threads[tid] = cpus_allowed(tid)
        except FileNotFoundError:  # it ended meanwhile
            pass
    with open(f"{out}.{local_rank}", "w") as f:
        json.dump({"threads": threads, "torch_threads": torch.get_num_threads()}, f)
    return torch.nn.Linear(num_features, num_outputs), torch.nn.functional.cross_entropy
