"""The reference workload's loop under replica recovery (`eagleeye run --recovery replica`).

Inside a replica the ranks are data-parallel over a gloo (or NCCL) group of their own;
across replicas the gradient goes through ``ft_runtime.ftar``'s fault-tolerant all-reduce.
A relaunched replica first catches up from a healthy peer and sends a zero gradient in its
first exchange. Each replica reads its own stream of batches, and which batches it trained
is recorded in the quorum's store, so a restart neither repeats nor skips one.

The epoch's source replica checkpoints every ``--checkpoint-every`` steps (with every
replica's data position); a job relaunched as a whole restores from the newest checkpoint,
and the supervisor's commands (checkpoint, rollback, skip_batch) run at a step boundary
every member agreed on.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils import clip_grad_norm_

import eagleeye
from eagleeye.workload.data import ShardedSampler
from eagleeye.workload.model import GPT
from ft_runtime import _dist as dist
from ft_runtime.catchup import SERVE_NICE
from ft_runtime.checkpoint import DiskCheckpointer
from ft_runtime.commands import CHECKPOINT, ROLLBACK, Command
from ft_runtime.errors import CheckpointsUnusable
from ft_runtime.ftar import ExchangeResult, ReplicaComm
from ft_runtime.layout import ENV_CATCHUP_TOKEN, ENV_SERVE_NICE
from ft_runtime.quorum import ENV_QUORUM
from ft_runtime.replica import restore_priority
from ft_runtime.replica.protocol import Failed, Refused, Restored, Saved, Skipped

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
        serve_nice=int(env.get(ENV_SERVE_NICE, SERVE_NICE)),
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
    state = _Replica(ee, comm, model, optimizer, sampler)
    start, joining = 0, comm.must_join
    if joining:

        def load(state: dict[str, Any]) -> None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

        began = time.perf_counter()
        start = comm.join(
            load,
            lambda update, lr: _apply(params, optimizer, update, lr),
            ready=restore_priority,  # launched at a lower priority, caught up now
        )
        # the peer tier: a healthy replica's snapshot plus the steps replayed since
        seconds = f"{time.perf_counter() - began:.6f}"
        ee.hook.event("event.restore", float(start), tier="peer", seconds=seconds)
        state.seek(comm.next_batch())
    elif comm.incarnation > 0:  # relaunched with the whole job: from the newest checkpoint
        start = state.restore(None) + 1
    else:
        state.seek(comm.next_batch())
    loss_value = math.nan
    step = start
    while step < args.steps:
        current["step"] = step
        began = time.perf_counter()
        ee.step_start(step)
        ee.faults.fire(step)
        loss = _local_gradient(ee, model, optimizer, sampler, step, joining)
        ee.faults.fire(step, "collective")
        flat, result = _exchange(ee, comm, params, step, state.batch)
        with ee.section("optimizer"):
            # the schedule's rate, scaled for missing replicas and by every rollback's factor
            lr = learning_rate(step, args) * result.lr_scale * state.lr_factor  # type: ignore[operator]
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
            metrics["batch"] = float(state.batch)
            state.batch += 1
        joining = False
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            state.checkpoint(step)
        time.sleep(max(0.0, args.step_floor_s - (time.perf_counter() - began)))
        ee.step_end(step, **metrics)
        step = state.run_commands(step) + 1
    state.flush()
    _save_params(args, ee, model)
    comm.close()
    return loss_value


class _Replica:
    """This rank's checkpoints and data position under replica recovery, and the control
    commands that act on them (checkpoint, rollback, skip_batch).

    Healthy replicas hold bitwise the same state, so one of them (the epoch's source, the
    lowest healthy replica) saves for all; with the state go the data positions of every
    replica (``marks``), so a restore resumes each replica's stream where that state left it.
    """

    def __init__(
        self,
        ee: eagleeye.RankSession,
        comm: ReplicaComm,
        model: GPT,
        optimizer: torch.optim.Optimizer,
        sampler: ShardedSampler,
    ) -> None:
        self.ee, self.comm, self.model, self.optimizer = ee, comm, model, optimizer
        self.sampler = sampler
        self.lr_factor = 1.0  # the product of the rollbacks' lr_factor so far
        self.disk = DiskCheckpointer(
            Path(ee.checkpoints.directory) / "replicas",
            comm.replica_rank,
            comm.replica_size,
            barrier=None,  # replica rank 0 writes the manifest once every file is there
            keep=ee.checkpoints.keep,
        )
        self.batch = 0
        self._marks = [0] * comm.num_replicas
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        self._writes: list[Future[None]] = []

    def seek(self, batch: int) -> None:
        self.batch = batch
        seek(self.sampler, batch)

    # ---- checkpoints -----------------------------------------------------------------------
    def checkpoint(self, step: int, done: Callable[[str], None] = lambda path: None) -> bool:
        """Saves after ``step`` if this replica is the epoch's source: the loop waits only
        for a memory copy, a background thread writes it (the others must not wait on the
        disk, nor take a slow save for a hang). ``done(path)`` follows the write."""
        if self.comm.membership.source != self.comm.replica:
            return False
        with self.ee.section("checkpoint"):
            self._marks = [
                self.comm.next_batch(mark, replica) for replica, mark in enumerate(self._marks)
            ]
            state = {
                "model": _copied(self.model.state_dict()),
                "optimizer": _copied(self.optimizer.state_dict()),
                "marks": list(self._marks),
            }
        self._writes.append(self._writer.submit(self._write, state, step, done))
        return True

    def _write(self, state: dict[str, Any], step: int, done: Callable[[str], None]) -> None:
        saved = self.disk.save(state, step)
        self.ee.report_saved(saved, step)
        done(saved.path)

    def flush(self) -> None:
        """Waits for the checkpoints being written; a failed write raises here."""
        writes, self._writes = self._writes, []
        for write in writes:
            write.result()

    def restore(self, at_most: int | None) -> int:
        """Loads the newest checkpoint (no later than ``at_most``) and moves the data stream
        back to it; returns its step, or -1 when there is none (a fresh start)."""
        self.flush()
        restored = self.disk.load(at_most)
        if restored is None:
            if at_most is not None:
                return -2
            self.comm.forget_batches(0)
            self.seek(0)
            return -1
        step, state = restored
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._marks = [int(m) for m in state["marks"]]
        mark = self._marks[self.comm.replica]
        self.comm.barrier()  # every rank read the accounting before rank 0 rewrites it
        self.comm.forget_batches(mark)
        self.seek(mark)
        self.ee.hook.event("event.restore", float(step), tier="disk")
        return step

    # ---- control commands ------------------------------------------------------------------
    def run_commands(self, step: int) -> int:
        """Runs the commands agreed in this step's exchange; returns the step that counts
        as done (``step``, or the checkpoint's after a rollback)."""
        for command in self.comm.commands():
            if command.kind == CHECKPOINT:

                def saved(path: str, command: Command = command, step: int = step) -> None:
                    self.comm.answer(command, Saved(step, path))

                if not self.checkpoint(step, saved):
                    self.comm.answer(command, Refused("not the epoch's source: it saves"))
            elif command.kind == ROLLBACK:
                try:
                    restored = self.restore(command.step)
                except CheckpointsUnusable as exc:  # the rollback fails; training goes on
                    self.comm.answer(command, Failed(str(exc)[:1000]))
                    continue
                if restored == -2:
                    self.comm.answer(command, Failed(f"no checkpoint at or before {command.step}"))
                    continue
                self.lr_factor *= command.lr_factor
                self.comm.answer(command, Restored(restored, step, self.lr_factor))
                step = restored
            elif command.applies_to(self.comm.replica):  # skip_batch
                self.comm.skip_batch(self.batch)
                self.comm.answer(command, Skipped(self.batch))
                self.ee.hook.event("event.skip_batch", float(self.batch))
                self.seek(self.batch + 1)
            else:
                self.comm.answer(command, Refused("skip_batch names other replicas"))
        return step


def _copied(value: Any) -> Any:
    """A deep copy of a state dict's tensors (the loop goes on changing the originals)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copied(v) for v in value)
    return value


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
