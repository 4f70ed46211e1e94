"""A PyTorch Lightning script with replica recovery (docs/replica-api.md, Frameworks).

    eagleeye run --recovery replica --remediate --replicas 2 --nproc-per-node 4 \
        examples/lightning_train_replica.py -- --steps 100

``ReplicaStrategy`` runs DDP inside each replica and the fault-tolerant exchange across
replicas; ``ReplicaSampler`` hands out each replica's batches exactly once. The one change
a Lightning user makes to the module: ``training_step`` takes ``dataloader_iter`` and draws
its batch itself, so that Lightning fetches no batch ahead of the ledger.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ft_runtime import replica
from ft_runtime.replica.lightning import ReplicaStrategy

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--params-out", default="")
parser.add_argument("--step-seconds", type=float, default=0.0)  # stands for a bigger model
args = parser.parse_args()
torch.set_num_threads(1)


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, dataloader_iter):
        (x, y), _, _ = next(dataloader_iter)  # the ledger's next batch, fetched now
        time.sleep(args.step_seconds)
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=args.lr, momentum=0.9)


strategy = ReplicaStrategy()
inputs = torch.randn(4096, 16, generator=torch.Generator().manual_seed(1))
dataset = TensorDataset(inputs, torch.sin(inputs).sum(dim=1, keepdim=True))
sampler = replica.ReplicaSampler(dataset, strategy.manager, args.batch_size, seed=0)
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
model = Regression()
trainer = L.Trainer(
    accelerator="cpu",
    devices=strategy.manager.replica_size,
    strategy=strategy,
    max_steps=args.steps,
    use_distributed_sampler=False,
    enable_checkpointing=False,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(model, train_dataloaders=loader)

if args.params_out:
    os.makedirs(args.params_out, exist_ok=True)
    path = os.path.join(args.params_out, f"rank-{os.environ['RANK']}.pt")
    torch.save(model.state_dict(), path)
