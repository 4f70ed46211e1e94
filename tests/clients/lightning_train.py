"""A small Lightning model trained with DDP, validated every few steps by a slow evaluation.

    torchrun --nproc-per-node 2 lightning_train.py --max_steps 60 --val_every 20 --val_seconds 8
    torchrun --nproc-per-node 2 lightning_train.py --max_steps 60 --resume

The validation pass stands for an expensive evaluation (generation, an external scorer): it
takes about ``--val_seconds`` during which no training step completes. With ``--resume`` the
fit continues from the newest checkpoint in ``--out_dir``.
"""

import argparse
import os
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", default="lightning_out")
parser.add_argument("--max_steps", type=int, default=60)
parser.add_argument("--val_every", type=int, default=20)
parser.add_argument("--val_seconds", type=float, default=8.0)
parser.add_argument("--batch_size", type=int, default=32)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

VAL_BATCHES = 4


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(args.val_seconds / VAL_BATCHES)  # the expensive part of a real evaluation
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    return TensorDataset(x, x[:, :4].sum(dim=1, keepdim=True).sin())


if __name__ == "__main__":
    pl.seed_everything(0)
    train = DataLoader(dataset(20_000, 0), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(dataset(VAL_BATCHES * args.batch_size, 1), batch_size=args.batch_size)
    checkpoints = ModelCheckpoint(dirpath=args.out_dir, every_n_train_steps=10, save_last=True)
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        val_check_interval=args.val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        accelerator="auto",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        num_nodes=int(os.environ.get("WORLD_SIZE", 1)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", 1)) > 1 else "auto",
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out_dir,
    )
    trainer.fit(Regressor(), train, val, ckpt_path="last" if args.resume else None)
    if trainer.global_rank == 0:
        print(f"done after {trainer.global_step} steps", flush=True)
