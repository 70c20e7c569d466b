"""Horovod with PyTorch, as the design text writes it (hvd.init, hvd.DistributedOptimizer, broadcast_parameters):
trained under ringflow (engine "horovod": horovodrun starts the ranks) on the job's sharded dataset,
checkpointed and resumed through its API."""
import horovod.torch as hvd
import torch
import torch.nn.functional as F

import ringflow.training.api as ringflow

hvd.init()  # horovodrun's rank and size; ringflow set its Horovod knobs from the job config
ctx = ringflow.get_context()
shard = ringflow.get_dataset_shard()
torch.manual_seed(ctx.config.seed)


class Net(torch.nn.Module):
    def __init__(self, features, outputs):
        super().__init__()
        self.fc1 = torch.nn.Linear(features, 64)
        self.fc2 = torch.nn.Linear(64, outputs)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


model = Net(shard.schema.num_features, shard.schema.num_outputs)
optimizer = torch.optim.SGD(model.parameters(), lr=ctx.config.learning_rate * hvd.size(), momentum=0.9)
state = ringflow.get_checkpoint()
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])

optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # every rank starts from rank 0's
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

for epoch in shard.epochs():
    for data, target in shard:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()  # Horovod all-reduces the gradients
        ringflow.report({"loss": loss.item()},
                        checkpoint={"model": model.state_dict(), "optimizer": optimizer.state_dict()})

if hvd.rank() == 0:
    x, y = ringflow.get_eval_data()
    with torch.no_grad():
        out = model(x)
    ringflow.report_eval({"accuracy": (out.argmax(1) == y).double().mean().item(),
                          "loss": F.cross_entropy(out, y).item()})
