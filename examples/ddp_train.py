"""Train a small model with DistributedDataParallel: a plain PyTorch script.

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 100 --ckpt ckpt.pt

Rank 0 saves ``--ckpt`` every ``--checkpoint-every`` steps; a run started again resumes
from it. ``ddp_train_replica.py`` is the same script converted to replica recovery.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--ckpt", default="ckpt.pt")
parser.add_argument("--checkpoint-every", type=int, default=20)
parser.add_argument("--params-out", default="")
parser.add_argument("--step-seconds", type=float, default=0.0)  # stands for a bigger model
parser.add_argument("--load-seconds", type=float, default=0.0)  # and its load time
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
torch.manual_seed(0)

model = DDP(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)


def state_dict():
    return {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}


def load(state):
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    time.sleep(args.load_seconds)


inputs = torch.randn(4096, 16, generator=torch.Generator().manual_seed(1))
dataset = TensorDataset(inputs, torch.sin(inputs).sum(dim=1, keepdim=True))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

step = 0
if os.path.exists(args.ckpt):
    checkpoint = torch.load(args.ckpt)
    load(checkpoint)
    step = checkpoint["step"]

epoch = 0
while step < args.steps:
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        time.sleep(args.step_seconds)
        optimizer.step()
        step += 1
        if rank == 0 and step % args.checkpoint_every == 0:
            state = state_dict()
            state["step"] = step
            torch.save(state, args.ckpt + ".tmp")
            os.replace(args.ckpt + ".tmp", args.ckpt)
        if step >= args.steps:
            break
    epoch += 1

if args.params_out:
    os.makedirs(args.params_out, exist_ok=True)
    path = os.path.join(args.params_out, f"rank-{os.environ['RANK']}.pt")
    torch.save(model.module.state_dict(), path)
dist.destroy_process_group()
