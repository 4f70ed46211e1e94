"""The reference workload's loop under replica recovery (`eagleeye run --recovery replica`).

Inside a replica the ranks are data-parallel over a gloo (or NCCL) group of their own;
across replicas the gradient goes through ``ft_runtime.ftar``'s fault-tolerant all-reduce.
A relaunched replica first catches up from a healthy peer and sends a zero gradient in its
first exchange. Each replica reads its own stream of batches, and which batches it trained
is recorded in the quorum's store, so a restart neither repeats nor skips one.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils import clip_grad_norm_

import eagleeye
from eagleeye.workload.data import ShardedSampler
from eagleeye.workload.model import GPT
from ft_runtime import _dist as dist
from ft_runtime.ftar import ExchangeResult, ReplicaComm
from ft_runtime.layout import ENV_CATCHUP_TOKEN
from ft_runtime.quorum import ENV_QUORUM

ENV_LR_SCALING = "EAGLEEYE_LR_SCALING"
"""``sqrt`` (default): lr × √(contributing/total replicas) while some are missing; ``none``."""
ENV_CROSS_TIMEOUT = "EAGLEEYE_CROSS_TIMEOUT_S"
"""Last-resort timeout of one cross-replica exchange, seconds (default 30)."""


def connect(ee: eagleeye.RankSession, model: GPT, optimizer: torch.optim.Optimizer) -> ReplicaComm:
    """The rank's replica communicator, from the environment the supervisor set."""
    address = os.environ[ENV_QUORUM]
    host, _, port = address.rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    env = os.environ
    return ReplicaComm(
        store,
        address,
        replica=ee.replica,
        replica_rank=int(env.get("EAGLEEYE_REPLICA_RANK", 0)),
        replica_size=int(env.get("EAGLEEYE_REPLICA_SIZE", 1)),
        num_replicas=int(env.get("EAGLEEYE_NUM_REPLICAS", 1)),
        incarnation=ee.attempt,
        state_fn=lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
        cross_timeout_s=float(env.get(ENV_CROSS_TIMEOUT, 30.0)),
        lr_scaling=env.get(ENV_LR_SCALING, "sqrt") != "none",
        token=env.get(ENV_CATCHUP_TOKEN, ""),
    )


def seek(sampler: ShardedSampler, batch: int) -> None:
    """Moves the sampler to this replica's ``batch``-th global batch."""
    global_batch = sampler.batch_size * sampler.world_size
    per_epoch = sampler.num_windows // global_batch
    state = {
        "epoch": batch // per_epoch,
        "position": (batch % per_epoch) * global_batch,
        "seed": sampler.seed,
    }
    sampler.load_state_dict(state)


def train(
    ee: eagleeye.RankSession,
    args: argparse.Namespace,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    sampler: ShardedSampler,
    current: dict[str, int],
    learning_rate: object,
) -> float:
    """Trains to ``args.steps`` as one replica among others; returns the last local loss."""
    params = list(model.parameters())
    comm = connect(ee, model, optimizer)
    start, joining = 0, comm.incarnation > 0
    if joining:

        def load(state: dict[str, Any]) -> None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

        began = time.perf_counter()
        start = comm.join(load, lambda update, lr: _apply(params, optimizer, update, lr))
        # the peer tier: a healthy replica's snapshot plus the steps replayed since
        seconds = f"{time.perf_counter() - began:.6f}"
        ee.hook.event("event.restore", float(start), tier="peer", seconds=seconds)
    batch = comm.next_batch()
    seek(sampler, batch)
    loss_value = math.nan
    for step in range(start, args.steps):
        current["step"] = step
        began = time.perf_counter()
        ee.step_start(step)
        ee.faults.fire(step)
        loss = _local_gradient(ee, model, optimizer, sampler, step, joining)
        ee.faults.fire(step, "collective")
        flat, result = _exchange(ee, comm, params, step, batch)
        with ee.section("optimizer"):
            lr = learning_rate(step, args) * result.lr_scale  # type: ignore[operator]
            grad_norm = _apply(params, optimizer, flat, lr)
        comm.after_step(step, flat, lr)
        metrics = {
            "grad_norm": grad_norm,
            "lr": lr,
            "replicas": float(result.contributors),
            "epoch": float(result.epoch),
            "exchange_retries": float(result.retries),
            "catch_up": float(joining),
            "serving_catch_up": float(comm.source.serving),
        }
        if joining:
            metrics["replayed_steps"] = float(comm.replayed)
        if loss is not None:
            loss_value = loss
            metrics |= {"loss": loss, "tokens": float(sampler.batch_size * sampler.block_size)}
            metrics["batch"] = float(batch)
            batch += 1
        joining = False
        time.sleep(max(0.0, args.step_floor_s - (time.perf_counter() - began)))
        ee.step_end(step, **metrics)
    _save_params(args, ee, model)
    comm.close()
    return loss_value


def _local_gradient(
    ee: eagleeye.RankSession,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    sampler: ShardedSampler,
    step: int,
    joining: bool,
) -> float | None:
    """Forward and backward on this replica's next batch; a joiner has none (zeros)."""
    optimizer.zero_grad(set_to_none=False)
    if joining:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        return None
    with ee.section("data"):
        x, y = sampler.next_batch()
    with ee.section("forward"):
        _, loss = model(x, y)
        assert loss is not None
        loss = loss * ee.faults.loss_multiplier(step)
    with ee.section("backward"):
        loss.backward()
    return float(loss.item())


def _exchange(
    ee: eagleeye.RankSession,
    comm: ReplicaComm,
    params: list[torch.nn.Parameter],
    step: int,
    batch: int,
) -> tuple[torch.Tensor, ExchangeResult]:
    """The averaged flat gradient of this step and how the exchange went."""
    flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
    with ee.section("allreduce"), ee.collective("ft_all_reduce", flat.numel() * 4, "replicas"):
        result = comm.exchange(flat, step, batch)
    return flat, result


def _apply(
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    flat: torch.Tensor,
    lr: float,
) -> float:
    """One optimizer step from an averaged flat gradient; the same code trains and replays,
    so a replayed step gives bitwise the parameters of the trained one."""
    offset = 0
    for p in params:
        if p.grad is None:  # a replica that replays before its first backward
            p.grad = torch.zeros_like(p)
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    for group in optimizer.param_groups:
        group["lr"] = lr
    grad_norm = float(clip_grad_norm_(params, 1.0))
    if math.isfinite(grad_norm):  # a non-finite gradient is dropped by every replica alike
        optimizer.step()
    return grad_norm


def _save_params(args: argparse.Namespace, ee: eagleeye.RankSession, model: GPT) -> None:
    """Writes the final parameters (tests compare them across replicas bit for bit)."""
    if getattr(args, "params_out", None):
        folder = Path(args.params_out)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), folder / f"rank-{ee.rank}.pt")
