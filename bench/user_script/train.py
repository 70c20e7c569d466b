"""The bench's user script (bench/user_script_bench.py): a data team's DDP or Horovod training loop, run either by
ringflow with its training API (the job's shards dealt by get_dataset_shard, report() every step with the state
to checkpoint, ringflow's checkpoint cadence at its defaults) or by plain torchrun / horovodrun, reading the same
shard files into memory itself. Rank 0 prints one line: BENCH {"samples_per_sec": ..., "steps": ...} over the
steps after the warm-up.

    train.py --engine ddp|horovod --manifest MANIFEST --epochs E --batch B --lr LR
"""
import argparse
import json
import os
import time

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

import ringflow.training.api as ringflow

WARMUP_STEPS = 30
parser = argparse.ArgumentParser()
parser.add_argument("--engine", required=True)
parser.add_argument("--manifest", required=True)
parser.add_argument("--epochs", type=int, default=30)
parser.add_argument("--batch", type=int, default=256)
parser.add_argument("--lr", type=float, default=0.001)
args = parser.parse_args()
torch.set_num_threads(1)

if args.engine == "horovod":
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
else:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()


def plain_batches(epoch):
    """This rank's partition file, in memory, shuffled each epoch: what a plain script does with the files."""
    x, y = plain_batches.rows
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
    for start in range(0, len(x), args.batch):
        index = order[start:start + args.batch]
        yield x[index], y[index]


manifest = json.load(open(args.manifest))
features = [c for c in manifest["schema"]["features"]]
if not ringflow.in_job():
    table = pq.read_table(os.path.join(os.path.dirname(args.manifest), manifest["partitions"][rank]["key"]))
    plain_batches.rows = (torch.from_numpy(np.stack([table.column(f).to_numpy() for f in features], 1)
                                           .astype(np.float32)),
                          torch.from_numpy(table.column("target").to_numpy().astype(np.int64)))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(len(features), 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                            torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
if args.engine == "horovod":
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    net = model
else:
    net = DDP(model)

shard = ringflow.get_dataset_shard() if ringflow.in_job() else None
epochs = shard.epochs() if shard is not None else range(args.epochs)
step, started = 0, None
for epoch in epochs:
    for x, y in (shard if shard is not None else plain_batches(epoch)):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        value = loss.item()
        step += 1
        if step == WARMUP_STEPS:
            started = time.perf_counter()
        if shard is not None:
            ringflow.report({"loss": value}, checkpoint={"model": model.state_dict(),
                                                        "optimizer": optimizer.state_dict()})
seconds = time.perf_counter() - started
if rank == 0:
    print("BENCH " + json.dumps({"samples_per_sec": (step - WARMUP_STEPS) * args.batch * size / seconds,
                                 "steps": step}), flush=True)
