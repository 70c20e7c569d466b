"""PyTorch DDP, as the design text writes it (dist.init_process_group + DDP(model)), with an LR scheduler and
gradient clipping: trained under ringflow on the job's sharded dataset, checkpointed and resumed through its API."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ringflow.training.api as ringflow

dist.init_process_group("gloo", init_method="env://")  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR/PORT
ctx = ringflow.get_context()
shard = ringflow.get_dataset_shard()
torch.manual_seed(ctx.config.seed)

model = torch.nn.Sequential(torch.nn.Linear(shard.schema.num_features, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, shard.schema.num_outputs))
optimizer = torch.optim.Adam(model.parameters(), lr=ctx.config.learning_rate * ctx.world_size)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.9)
state = ringflow.get_checkpoint()
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
ddp_model = DDP(model)  # broadcasts rank 0's parameters

for epoch in shard.epochs():
    for data, labels in shard:
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp_model(data), labels)
        loss.backward()  # DDP all-reduces the gradients
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        ringflow.report({"loss": loss.item(), "lr": scheduler.get_last_lr()[0]},
                        checkpoint={"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                    "scheduler": scheduler.state_dict()})

if ctx.rank == 0:
    x, y = ringflow.get_eval_data()
    with torch.no_grad():
        out = model(x)
    ringflow.report_eval({"accuracy": (out.argmax(1) == y).double().mean().item(),
                          "loss": F.cross_entropy(out, y).item()})
dist.destroy_process_group()
