"""A model factory one of whose ranks runs out of memory for real, at a chosen step (imported by the ranks
through PYTHONPATH; used by test_out_of_memory.py).

how:
  memory_error  the rank's address space is capped (RLIMIT_AS, as prlimit does) just above what it uses,
                then it allocates a bytearray past the cap: Python raises MemoryError
  torch         the same cap, then torch.empty past it: torch's CPU allocator raises its RuntimeError
                ("DefaultCPUAllocator: can't allocate memory")
  kernel        the rank moves itself into `cgroup` (a memory cgroup the test made, with a small
                memory.limit_in_bytes) when its model is built, and at the step touches more than the limit:
                the kernel's OOM killer SIGKILLs it
The cap stays (the rank's evidence reads it); 256 MiB of room is left for the rank's last word.
"""
import os
import resource
import time

import torch

MiB = 2**20


def rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def address_space() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


class Hungry(torch.nn.Module):
    def __init__(self, num_features, num_outputs, how, at_step, oom):
        super().__init__()
        self.linear = torch.nn.Linear(num_features, num_outputs)
        self.how, self.at_step, self.oom, self.calls = how, at_step, oom, 0

    def forward(self, x):
        self.calls += 1
        if self.oom and self.calls == self.at_step:
            self.run_out()
        return self.linear(x)

    def run_out(self):
        if self.how == "kernel":
            # A real OOM comes after a while, when rank 0's heartbeat has long shown its step (the launcher
            # names the step from it: a killed rank says nothing). Here it comes at step 3, within a second of
            # the start, so the rank lets a few of rank 0's heartbeats (the test sets 0.25 s) pass first.
            time.sleep(1.5)
            block = bytearray(2048 * MiB)
            block[::4096] = b"x" * len(block[::4096])  # touched: charged to the cgroup page by page
            return
        # Left in place: the rank reads it as the memory it had, and has 256 MiB of room for its last word.
        resource.setrlimit(resource.RLIMIT_AS, (address_space() + 256 * MiB, resource.RLIM_INFINITY))
        if self.how == "torch":
            torch.empty(2**30, dtype=torch.float64)  # 8 GiB
        else:
            bytearray(8192 * MiB)


def build(num_features, num_outputs, task, how, oom_rank=1, at_step=3, cgroup=None):
    oom = rank() == oom_rank
    if oom and how == "kernel":
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    return Hungry(num_features, num_outputs, how, at_step, oom), torch.nn.functional.cross_entropy
