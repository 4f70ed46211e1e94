"""The reference workload's loop under replica recovery (`eagleeye run --recovery replica`).

It is an ordinary user of the public replica API (``ft_runtime.replica.Manager``,
docs/replica-api.md): the manager owns membership, the fault-tolerant all-reduce, the
catch-up of a relaunched replica (which then sends a zero gradient in its first exchange),
the data ledger (each replica reads its own stream of batches and resumes at its first
untrained one) and the controller's commands; what remains here is the model loop and the
workload's own checkpoints, which the manager's callbacks save and restore.

The epoch's source replica checkpoints every ``--checkpoint-every`` steps (with every
replica's data position): into the job's snapshot holders when it has them
(``eagleeye run --snapshots``), else to disk. A job relaunched as a whole restores from the
newest checkpoint (with holders: memory, then a peer node, then storage), and the
supervisor's commands (checkpoint, rollback, skip_batch) run at a step boundary
every member agreed on.
"""

from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils import clip_grad_norm_

import eagleeye
from eagleeye.workload.data import ShardedSampler
from eagleeye.workload.model import GPT
from ft_runtime.checkpoint import DiskCheckpointer
from ft_runtime.errors import CheckpointError
from ft_runtime.replica import Manager, Snapshots
from ft_runtime.replica.manager import ENV_CROSS_TIMEOUT, ENV_LR_SCALING

__all__ = ["ENV_CROSS_TIMEOUT", "ENV_LR_SCALING", "seek", "train"]


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
    saver = _Checkpoints(ee, model, optimizer)

    def load(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    manager = Manager(
        state_dict=lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
        load_state_dict=load,
        save_checkpoint=saver.save_now,
        load_checkpoint=saver.restore,
    )
    saver.attach(manager)
    manager.set_apply(lambda update, lr: _apply(params, optimizer, update, lr))
    joining = manager.comm.must_join
    if joining:
        began = time.perf_counter()
        manager.begin_step()  # catches up from a healthy peer
        # the peer tier: a healthy replica's snapshot plus the steps replayed since
        seconds = f"{time.perf_counter() - began:.6f}"
        ee.hook.event("event.restore", float(manager.step), tier="peer", seconds=seconds)
    elif manager.comm.incarnation > 0:  # relaunched with the whole job: the newest checkpoint
        saver.restore(None)
    manager.begin_step()
    position = -1
    loss_value = math.nan
    while manager.step < args.steps:
        step = manager.step
        current["step"] = step
        if position != manager.batch:  # a restart, a skipped batch or a rollback moved it
            seek(sampler, manager.batch)
        began = time.perf_counter()
        ee.step_start(step)
        ee.faults.fire(step)
        loss = _local_gradient(ee, model, optimizer, sampler, step, manager.joining)
        ee.faults.fire(step, "collective")
        flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
        with ee.section("allreduce"), ee.collective("ft_all_reduce", flat.numel() * 4, "replicas"):
            result = manager.allreduce(flat)
        with ee.section("optimizer"):
            # the schedule's rate, scaled for missing replicas and by every rollback's factor
            lr = learning_rate(step, args) * result.lr_scale  # type: ignore[operator]
            grad_norm = _apply(params, optimizer, flat, lr)
        metrics = {
            "grad_norm": grad_norm,
            "lr": lr,
            "replicas": float(result.contributors),
            "epoch": float(result.epoch),
            "exchange_retries": float(result.retries),
            "catch_up": float(manager.joining),
            "serving_catch_up": float(manager.comm.source.serving),
        }
        if manager.joining:
            metrics["replayed_steps"] = float(manager.comm.replayed)
        if loss is not None:
            loss_value = loss
            metrics |= {"loss": loss, "tokens": float(sampler.batch_size * sampler.block_size)}
            metrics["batch"] = float(manager.batch)
        position = manager.batch + (loss is not None)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            saver.save_in_background(step)
        time.sleep(max(0.0, args.step_floor_s - (time.perf_counter() - began)))
        ee.step_end(step, **metrics)
        skipped = len(manager.skipped)
        manager.commit(flat, lr)  # serves a catch-up, marks the batch, runs commands
        for batch in manager.skipped[skipped:]:
            ee.hook.event("event.skip_batch", float(batch))
    saver.close()
    _save_params(args, ee, model)
    manager.close()
    return loss_value


class _Checkpoints:
    """The workload's own checkpoints: one file per rank of the saving replica (the
    epoch's source, which the manager names), written by a background thread so the loop
    waits only for a memory copy; with snapshot holders, each rank's share copied into its
    node's holder instead. The manager's state (every replica's data position) goes with
    them, so a restore resumes each replica's stream where that state left it.
    """

    def __init__(
        self, ee: eagleeye.RankSession, model: GPT, optimizer: torch.optim.Optimizer
    ) -> None:
        self.ee, self.model, self.optimizer = ee, model, optimizer
        self.manager: Manager | None = None
        self.disk: DiskCheckpointer | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        self._writes: list[Future[str]] = []
        self.snapshots: Snapshots | None = None

    def attach(self, manager: Manager) -> None:
        self.manager = manager
        self.snapshots = Snapshots.from_env(manager)

    def _disk(self) -> DiskCheckpointer:
        assert self.manager is not None
        if self.disk is None:
            self.disk = DiskCheckpointer(
                Path(self.ee.checkpoints.directory) / "replicas",
                self.manager.replica_rank,
                self.manager.replica_size,
                barrier=None,  # replica rank 0 writes the manifest once every file is there
                keep=self.ee.checkpoints.keep,
            )
        return self.disk

    def _state(self, copy: bool = True) -> dict[str, Any]:
        assert self.manager is not None
        keep = _copied if copy else (lambda state: state)
        with self.ee.section("checkpoint"):
            return {
                "model": keep(self.model.state_dict()),
                "optimizer": keep(self.optimizer.state_dict()),
                "manager": self.manager.state_dict(),
            }

    def save_in_background(self, step: int) -> None:
        """Saves after ``step`` if this replica saves for all (the others must not wait on
        the disk, nor take a slow save for a hang)."""
        assert self.manager is not None
        if not self.manager.is_saving_replica():
            return
        if self.snapshots is not None:  # blocks only for the copy into the holder
            self._snapshot(self._state(copy=False), step)
            return
        state = self._state()
        state["manager"]["step"] = step + 1
        self._writes.append(self._writer.submit(self._write, state, step))

    def save_now(self, step: int) -> str:
        """The controller's checkpoint command: saves after ``step``; returns the path."""
        if self.snapshots is not None:
            return self._snapshot(self._state(copy=False), step, strict=True)
        state = self._state()
        state["manager"]["step"] = step + 1
        return self._write(state, step)

    def _snapshot(self, state: dict[str, Any], step: int, strict: bool = False) -> str:
        """Copies this rank's share into its node's holder; a failed copy is reported (the
        holder keeps the previous snapshot) and raised only for the controller's command."""
        assert self.snapshots is not None
        state["manager"]["step"] = step + 1
        with self.ee.hook.pause("checkpoint"):
            saved = self.snapshots.save(state, step)
        labels = {"bytes": str(saved.nbytes), "seconds": f"{saved.blocking_s:.6f}"}
        if not saved.ok:
            labels["error"] = saved.error[:200]
        self.ee.hook.event("event.checkpoint", float(step), tier="memory", **labels)
        if strict and not saved.ok:
            raise CheckpointError(saved.error)
        return f"memory:{self.snapshots.client.cfg.node}/step_{step}"

    def _write(self, state: dict[str, Any], step: int) -> str:
        saved = self._disk().save(state, step)
        self.ee.report_saved(saved, step)
        return saved.path

    def flush(self) -> None:
        """Waits for the checkpoints being written; a failed write raises here."""
        writes, self._writes = self._writes, []
        for write in writes:
            write.result()

    def close(self) -> None:
        self.flush()
        if self.snapshots is not None:
            self.snapshots.close()

    def restore(self, at_most: int | None) -> int | None:
        """Loads the newest checkpoint (no later than ``at_most``) with the manager's state
        (the data positions); returns its step, or None when there is none."""
        assert self.manager is not None
        self.flush()
        if self.snapshots is not None:
            got = self.snapshots.load(at_most)
            if got is None:
                return None
            step, state, tier = got.step, got.state, got.tier
            labels = {"seconds": f"{got.seconds:.6f}"}
        else:
            restored = self._disk().load(at_most)
            if restored is None:
                return None
            (step, state), tier, labels = restored, "disk", {}
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.manager.load_state_dict(state["manager"])
        self.ee.hook.event("event.restore", float(step), tier=tier, **labels)
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
