"""The reference training script: data-parallel GPT training on the shipped corpus.

Runs under `eagleeye run -m eagleeye.workload.train` (or torchrun, or alone). Uses gloo on
CPU and NCCL on GPU; deterministic for a seed, resumable bit for bit from its checkpoints
(model, optimizer, RNG and data position).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.utils import clip_grad_norm_

import eagleeye
from eagleeye.workload.data import CharTokenizer, ShardedSampler, load_corpus
from eagleeye.workload.model import GPT, PRESETS, GPTConfig
from ft_runtime.quorum import ENV_QUORUM


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train the Eagle Eye reference GPT.")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--checkpoint-every", type=int, default=20, help="0 disables checkpoints")
    p.add_argument(
        "--timeout-s",
        type=float,
        default=60.0,
        help="collective timeout; a hung peer fails the step after this long",
    )
    p.add_argument("--result", default=None, help="write final metrics as JSON here (rank 0)")
    p.add_argument(
        "--params-out", default=None, help="save each rank's final parameters in this folder"
    )
    p.add_argument(
        "--step-floor-s",
        type=float,
        default=0.0,
        help="pad every step to at least this long (stands in for a bigger model's compute "
        "in tests and benchmarks; replica recovery only)",
    )
    return p.parse_args(argv)


def learning_rate(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to 10 % over the run: a pure function of step."""
    base, warmup, steps = float(args.lr), int(args.warmup), int(args.steps)
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, float(progress)))))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    ee = eagleeye.init()
    if os.environ.get(ENV_QUORUM):
        _main_replicated(ee, args)
        return
    device = _init_distributed(ee, args.timeout_s)
    torch.manual_seed(args.seed)
    tokenizer = CharTokenizer(load_corpus())
    data = tokenizer.encode(load_corpus())
    cfg = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=args.block_size, **PRESETS[args.preset]
    )
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01
    )
    sampler = ShardedSampler(
        data, args.block_size, args.batch_size, ee.rank, ee.world_size, args.seed
    )
    start = _restore(ee, model, optimizer, sampler)
    current = {"step": start}
    middle = model.blocks[len(model.blocks) // 2]
    middle.register_full_backward_hook(lambda *_: ee.faults.fire(current["step"], "backward"))
    params = [p for p in model.parameters()]
    with ee.instrument_collectives():
        loss_value = _train(ee, args, model, optimizer, sampler, params, start, current, device)
    _finish(ee, args, loss_value)


def _main_replicated(ee: eagleeye.RankSession, args: argparse.Namespace) -> None:
    """Replica recovery: no world group; replicas exchange through the quorum."""
    from eagleeye.workload import replicated

    torch.manual_seed(args.seed)
    tokenizer = CharTokenizer(load_corpus())
    data = tokenizer.encode(load_corpus())
    cfg = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=args.block_size, **PRESETS[args.preset]
    )
    model = GPT(cfg)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01
    )
    sampler = ShardedSampler(
        data, args.block_size, args.batch_size, ee.rank, ee.world_size, args.seed
    )
    current = {"step": 0}
    middle = model.blocks[len(model.blocks) // 2]
    middle.register_full_backward_hook(lambda *_: ee.faults.fire(current["step"], "backward"))
    loss_value = replicated.train(ee, args, model, optimizer, sampler, current, learning_rate)
    if args.result and ee.rank == 0:
        with open(args.result, "w") as handle:
            json.dump({"final_loss": loss_value, "steps": args.steps}, handle)
    ee.close()


def _train(
    ee: eagleeye.RankSession,
    args: argparse.Namespace,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    sampler: ShardedSampler,
    params: list[torch.nn.Parameter],
    start: int,
    current: dict[str, int],
    device: torch.device,
) -> float:
    """The training loop; returns the last step's local loss."""
    loss_value = math.nan
    for step in range(start, args.steps):
        current["step"] = step
        ee.step_start(step)
        ee.faults.fire(step)
        with ee.section("data"):
            x, y = (t.to(device) for t in sampler.next_batch())
        with ee.section("forward"):
            _, loss = model(x, y)
            assert loss is not None
            loss = loss * ee.faults.loss_multiplier(step)
        with ee.section("backward"):
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
        ee.faults.fire(step, "collective")
        with ee.section("allreduce"):
            _all_reduce_mean(ee, params)
        with ee.section("optimizer"):
            lr = learning_rate(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            grad_norm = float(clip_grad_norm_(params, 1.0))
            skipped = not math.isfinite(grad_norm)
            if not skipped:  # a non-finite gradient is dropped on every rank alike
                optimizer.step()
        if args.checkpoint_every and (
            (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps
        ):
            with ee.section("checkpoint"):
                ee.save_checkpoint(_state(model, optimizer, sampler), step)
        loss_value = loss.item()
        ee.step_end(
            step,
            loss=loss_value,
            grad_norm=grad_norm,
            lr=lr,
            tokens=float(x.numel()),
            skipped_step=float(skipped),
        )
    return loss_value


def _init_distributed(ee: eagleeye.RankSession, timeout_s: float) -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", ee.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if ee.world_size > 1:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return device


def _all_reduce_mean(ee: eagleeye.RankSession, params: list[torch.nn.Parameter]) -> None:
    if ee.world_size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])  # one bucket: one collective per step
    dist.all_reduce(flat)  # timed by the session's collective instrumentation
    flat /= ee.world_size
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def _state(
    model: GPT, optimizer: torch.optim.Optimizer, sampler: ShardedSampler
) -> dict[str, object]:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data": sampler.state_dict(),
        "rng": torch.get_rng_state(),
    }


def _restore(
    ee: eagleeye.RankSession, model: GPT, optimizer: torch.optim.Optimizer, sampler: ShardedSampler
) -> int:
    """Loads the newest checkpoint if there is one; returns the first step to train."""
    restored = ee.load_checkpoint(like={"model": model.state_dict()})
    if restored is None:
        return 0
    step, state = restored
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["data"])
    torch.set_rng_state(state["rng"])
    return step + 1


def _finish(ee: eagleeye.RankSession, args: argparse.Namespace, loss_value: float) -> None:
    if ee.world_size > 1:
        final = torch.tensor([loss_value])
        dist.all_reduce(final)
        loss_value = final.item() / ee.world_size
        dist.destroy_process_group()
    if args.result and ee.rank == 0:
        with open(args.result, "w") as handle:
            json.dump({"final_loss": loss_value, "steps": args.steps}, handle)
    ee.close()


if __name__ == "__main__":
    main()
