"""The peers' way of training the same model: plain Horovod (Gloo or MPI) or torch DDP with Gloo. Prints one
JSON line with samples/s measured after warm-up. Used by bench/throughput.py, which gives every peer the
settings ringflow's ranks run with (Open MPI's mpi_yield_when_idle, Horovod's fusion threshold and cycle
time, one core per rank, and, with --bind-cores, the same CPU binding: ringflow's own cores.py, before the
library starts its threads), so its ratios compare engines, not tuning.

`PlainLoop` is that plain loop on its own model, optimizer and in-memory rows; bench/loop_vs_plain.py runs
it inside a ringflow job, in blocks alternating with ringflow's own loop."""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from ringflow.training.rank.callbacks.throughput import job_samples_per_sec
from ringflow.training.formats.config import BIND_CORES, DEFAULT_BIND_CORES
from ringflow.training.rank.cores import claim_cpu_share, local_rank_from_env
from ringflow.training.formats.tf_config import LOCAL_PLACE_ENV as DDP_LOCAL_RANK_ENV
from ringflow.training.rank.engines.horovod import LOCAL_RANK_ENV as HOROVOD_LOCAL_RANK_ENV
from ringflow.training.rank.models import TabularMLP

CLASSES = 10
# Per-worker learning rate (scaled by the world size, as ringflow scales it); ringflow's jobs in the benchmarks
# are given the same, so both train alike (Adam's work per step depends a little on the values it sees).
LEARNING_RATE = 1e-3


def data(rank: int, rows: int, features: int, classes: int = CLASSES):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(rows, features, generator=g), torch.randint(0, classes, (rows,), generator=g)


class PlainLoop:
    """zero_grad, forward, backward, step over shuffled minibatches of rows held in memory: what a training
    script without ringflow does, with nothing else per step."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 batch: int):
        self.model, self.optimizer, self.x, self.y, self.batch = model, optimizer, x, y, batch
        self.order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        self.step = 0

    def run(self, steps: int) -> None:
        loss_fn, x, y, batch = torch.nn.functional.cross_entropy, self.x, self.y, self.batch
        for _ in range(steps):
            # Shuffled minibatches, as ringflow (and any DataLoader with shuffle=True) takes them.
            idx = self.order[(self.step * batch) % (len(x) - batch):][:batch]
            self.optimizer.zero_grad()
            loss_fn(self.model(x[idx]), y[idx]).backward()
            self.after_backward()
            self.optimizer.step()
            self.step += 1

    def after_backward(self) -> None:
        """Between the backward pass and the optimizer step (a subclass's own gradient exchange)."""


def plain_horovod(hvd, rank: int, size: int, features: int, hidden, batch: int, prefix: str = "") -> PlainLoop:
    """After hvd.init(). `prefix` names its tensors apart from another model's in the same job."""
    torch.manual_seed(0)
    model = TabularMLP(features, CLASSES, tuple(hidden))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=LEARNING_RATE * size),
                                         named_parameters=[(prefix + n, p) for n, p in model.named_parameters()])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return PlainLoop(model, optimizer, *data(rank, 8192, features), batch)


def plain_ddp(rank: int, size: int, features: int, hidden, batch: int) -> PlainLoop:
    """After dist.init_process_group (Gloo)."""
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(TabularMLP(features, CLASSES, tuple(hidden)))
    return PlainLoop(ddp, torch.optim.Adam(ddp.parameters(), lr=LEARNING_RATE * size), *data(rank, 8192, features), batch)


def timed(plain: PlainLoop, steps: int, warmup: int, sync) -> tuple[float, float]:
    """(samples, seconds) of this rank over `steps` after `warmup` steps, between two barriers: its time runs
    until every rank is done."""
    plain.run(warmup)
    sync()
    started = time.perf_counter()
    plain.run(steps)
    sync()
    return float(steps * plain.batch), time.perf_counter() - started


def bind_cores_arg(text: str) -> str | bool:
    return {"true": True, "false": False}.get(text, text)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=["horovod", "ddp"], required=True)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=10)
    # ringflow's ranks bind as their config says, "auto" unless told: the peer as its ranks would.
    p.add_argument("--bind-cores", type=bind_cores_arg, default=DEFAULT_BIND_CORES,
                   help=f"as the job config's bind_cores: one of {BIND_CORES}")
    args = p.parse_args()
    # Before the library starts its threads, as ringflow's engines bind.
    on_host = local_rank_from_env(os.environ, HOROVOD_LOCAL_RANK_ENV if args.framework == "horovod" else DDP_LOCAL_RANK_ENV)
    share = claim_cpu_share(args.bind_cores, *(on_host or (0, 1)))
    if args.framework == "horovod":
        import horovod.torch as hvd

        hvd.init()
        torch.set_num_threads(share.threads)
        rank, size = hvd.rank(), hvd.size()
        plain = plain_horovod(hvd, rank, size, args.features, args.hidden, args.batch)
        timings = hvd.allgather_object(timed(plain, args.steps, args.warmup,
                                             lambda: hvd.allreduce(torch.zeros(1), name="bench.barrier")))
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        torch.set_num_threads(share.threads)
        plain = plain_ddp(rank, size, args.features, args.hidden, args.batch)
        timings = [None] * size
        dist.all_gather_object(timings, timed(plain, args.steps, args.warmup, dist.barrier))
    if rank == 0:
        # The job's rate as ringflow's result counts its own: the slowest rank's, times the world size.
        samples, seconds = zip(*timings)
        print(json.dumps({"samples_per_sec": job_samples_per_sec(samples, seconds), "world_size": size}), flush=True)


if __name__ == "__main__":
    main()
