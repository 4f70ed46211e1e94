"""Train a small character-level language model with DistributedDataParallel.

Usage (one node, two processes):

    torchrun --nproc-per-node 2 ddp_train.py --max_iters 300
    torchrun --nproc-per-node 2 ddp_train.py --max_iters 300 --init_from=resume

Rank 0 writes ``<out_dir>/ckpt.pt`` every ``--eval_interval`` iterations, and when the job
is preempted (SIGTERM, as Slurm and Kubernetes send); a run resumes from it only with
``--init_from=resume``.
"""

import argparse
import math
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", default="out")
parser.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
parser.add_argument("--max_iters", type=int, default=300)
parser.add_argument("--eval_interval", type=int, default=50)
parser.add_argument("--log_interval", type=int, default=10)
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--block_size", type=int, default=64)
parser.add_argument("--n_embd", type=int, default=128)
parser.add_argument("--learning_rate", type=float, default=1e-3)
parser.add_argument("--seed", type=int, default=1337)
args = parser.parse_args()


class CharData(Dataset):
    """Overlapping windows of a synthetic text (a fixed pseudo-random walk over 64 symbols)."""

    def __init__(self, length: int, block_size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        steps = torch.randint(-2, 3, (length,), generator=g)
        self.text = torch.remainder(torch.cumsum(steps, 0), 64)
        self.block_size = block_size

    def __len__(self) -> int:
        return len(self.text) - self.block_size - 1

    def __getitem__(self, i: int):
        chunk = self.text[i : i + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class TinyLM(nn.Module):
    def __init__(self, vocab: int, n_embd: int, block_size: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.block = nn.TransformerEncoderLayer(n_embd, 4, 4 * n_embd, dropout=0.0, batch_first=True)
        self.head = nn.Linear(n_embd, vocab)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
        logits = self.head(self.block(x, src_mask=mask, is_causal=True))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = dist.get_world_size()
    device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if torch.cuda.is_available():
        torch.cuda.set_device(device)
else:
    rank, world_size, device = 0, 1, "cpu"
master_process = rank == 0
torch.manual_seed(args.seed)
os.makedirs(args.out_dir, exist_ok=True)

dataset = CharData(200_000, args.block_size, args.seed)
sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed) if ddp else None
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None)

model = TinyLM(64, args.n_embd, args.block_size).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
iter_num = 0
ckpt_path = os.path.join(args.out_dir, "ckpt.pt")
if args.init_from == "resume":
    print(f"Resuming training from {args.out_dir}")
    checkpoint = torch.load(ckpt_path, map_location=device)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model


def get_lr(it: int) -> float:
    warmup = 20
    if it < warmup:
        return args.learning_rate * (it + 1) / warmup
    progress = (it - warmup) / max(1, args.max_iters - warmup)
    return args.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


preempted = False


def on_sigterm(signum, frame):
    global preempted
    preempted = True


signal.signal(signal.SIGTERM, on_sigterm)


def save_checkpoint():
    checkpoint = {
        "model": raw_model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "iter_num": iter_num,
        "args": vars(args),
    }
    print(f"saving checkpoint to {args.out_dir}")
    torch.save(checkpoint, ckpt_path)


def everyone_preempted() -> bool:
    # every rank leaves at the same iteration, or the others would wait for it forever
    flag = torch.tensor([1.0 if preempted else 0.0], device=device)
    if ddp:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


epoch = iter_num // len(loader)
if sampler is not None:
    sampler.set_epoch(epoch)
batches = iter(loader)
t0 = time.time()
while iter_num < args.max_iters:
    try:
        x, y = next(batches)
    except StopIteration:
        epoch += 1
        if sampler is not None:
            sampler.set_epoch(epoch)
        batches = iter(loader)
        x, y = next(batches)
    x, y = x.to(device), y.to(device)
    for group in optimizer.param_groups:
        group["lr"] = get_lr(iter_num)
    loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    iter_num += 1

    if iter_num % args.log_interval == 0 and master_process:
        dt = time.time() - t0
        t0 = time.time()
        print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000 / args.log_interval:.2f}ms")
    if iter_num % args.eval_interval == 0 and master_process:
        save_checkpoint()
    if everyone_preempted():
        if master_process:
            print(f"preempted at iteration {iter_num}")
            save_checkpoint()
        break

if master_process:
    print(f"done after {iter_num} iterations")
if ddp:
    dist.destroy_process_group()
