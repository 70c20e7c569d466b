"""A PyTorch DDP script that loads its own data and calls nothing of ringflow's API: run by ringflow all the
same (its ranks, liveness, result.json), it resumes only as exactly as it makes itself (here: not at all)."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()  # the job config's entry.args

dist.init_process_group("gloo", init_method="env://")
rank, world_size = dist.get_rank(), dist.get_world_size()
print(f"own_loader: rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}", flush=True)

digits = load_digits()
data = TensorDataset(torch.tensor(digits.data / 16.0, dtype=torch.float32), torch.tensor(digits.target))
sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=32, sampler=sampler)

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"own_loader: rank {rank} epoch {epoch} loss {loss.item():.3f}", flush=True)
dist.destroy_process_group()
