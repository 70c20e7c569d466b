"""The peers' way of training the same model: plain Horovod (Gloo or MPI) or torch DDP with Gloo, each with
its own defaults. Prints one JSON line with samples/s measured after warm-up. Used by bench/throughput.py."""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from ringflow.training.models import TabularMLP


def data(rank: int, rows: int, features: int, classes: int):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(rows, features, generator=g), torch.randint(0, classes, (rows,), generator=g)


def loop(model, optimizer, x, y, batch, steps, warmup, sync=lambda: None):
    loss_fn = torch.nn.functional.cross_entropy
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            started = time.perf_counter()
        # Shuffled minibatches, as ringflow (and any DataLoader with shuffle=True) takes them.
        idx = order[(step * batch) % (len(x) - batch):][:batch]
        optimizer.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        optimizer.step()
    sync()
    return steps * batch / (time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=["horovod", "ddp"], required=True)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    torch.manual_seed(0)
    model = TabularMLP(args.features, 10, tuple(args.hidden))
    if args.framework == "horovod":
        import horovod.torch as hvd

        hvd.init()
        torch.set_num_threads(int(os.environ.get("RINGFLOW_TORCH_THREADS", "1")))
        rank, size = hvd.rank(), hvd.size()
        optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3 * size),
                                             named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        x, y = data(rank, 8192, args.features, 10)
        rate = loop(model, optimizer, x, y, args.batch, args.steps, args.warmup,
                    sync=lambda: hvd.allreduce(torch.zeros(1), name="bench.barrier"))
        rates = hvd.allgather_object(rate)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        torch.set_num_threads(int(os.environ.get("RINGFLOW_TORCH_THREADS", "1")))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3 * size)
        x, y = data(rank, 8192, args.features, 10)
        rate = loop(ddp, optimizer, x, y, args.batch, args.steps, args.warmup, sync=dist.barrier)
        rates = [None] * size
        dist.all_gather_object(rates, rate)
    if rank == 0:
        # Every rank processes its own batch; the job's rate is the slowest rank's rate times the world size.
        print(json.dumps({"samples_per_sec": min(rates) * size, "world_size": size}), flush=True)


if __name__ == "__main__":
    main()
