"""The rank side of replica recovery as a public API: ``Manager``.

A training script gives the manager two callbacks, ``state_dict`` and ``load_state_dict``
(what a peer needs to catch up, and how to take it), and from then on trains through it:

    manager = Manager(state_dict=lambda: {"model": model.state_dict(),
                                          "optim": optimizer.state_dict()},
                      load_state_dict=load)
    optimizer = OptimizerWrapper(manager, optimizer)

The manager owns what replica recovery needs from a rank: quorum membership, the
fault-tolerant all-reduce across replicas with its two-phase commit, the catch-up (as the
joiner that fetches a peer's state and replays the steps trained since, and as the source
that serves it), the learning-rate scale while replicas are missing, the exactly-once data
ledger, and the controller's commands. It reads where it sits from the environment that
``eagleeye run --recovery replica`` sets. docs/replica-api.md describes it for users.

The manager is lazy: nothing is exchanged and no catch-up starts until the first
``begin_step`` (``OptimizerWrapper.zero_grad`` calls it), so a script may load its own
checkpoint after creating the manager; a replica that must catch up then replaces that
state with its peer's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ft_runtime.catchup import SERVE_NICE
from ft_runtime.ftar import ExchangeResult, ReplicaComm
from ft_runtime.layout import (
    ENV_ATTEMPT,
    ENV_CATCHUP_HOST,
    ENV_CATCHUP_TOKEN,
    ENV_NUM_REPLICAS,
    ENV_REPLICA,
    ENV_REPLICA_RANK,
    ENV_REPLICA_SIZE,
    ENV_SERVE_NICE,
)
from ft_runtime.quorum import ENV_QUORUM
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.protocol import (
    CHECKPOINT,
    ROLLBACK,
    Command,
    Failed,
    Refused,
    Restored,
    Saved,
    Skipped,
)
from ft_runtime.replica.store import connect

__all__ = ["ENV_QUORUM", "Manager", "StepResult"]

ENV_LEDGER_LOG = "EAGLEEYE_LEDGER_LOG"
"""A folder: rank 0 of each replica appends one JSON line per committed step there (the
step and every replica's trained batch), an audit trail of the exactly-once ledger."""
ENV_CROSS_TIMEOUT = "EAGLEEYE_CROSS_TIMEOUT_S"
ENV_LR_SCALING = "EAGLEEYE_LR_SCALING"

Apply = Callable[[torch.Tensor, float], object]


@dataclass(frozen=True, slots=True)
class StepResult:
    """One committed step: its number, the lr scale it trained with, who contributed."""

    step: int
    lr_scale: float
    contributors: int
    members: int
    epoch: int
    retries: int


class Manager:
    """One rank's membership in a replica-recovery job.

    Args:
        state_dict: returns what a joining peer needs (model, optimizer, ...); called at a
            step boundary when this rank serves a catch-up.
        load_state_dict: loads such a state (a joiner, with its peer's).
        comm: the rank's replica communicator; by default one built from the environment
            ``eagleeye run --recovery replica`` sets.
        lr_scaling: multiply the learning rate by sqrt(contributors / replicas) while
            replicas are missing (``OptimizerWrapper`` applies it); by default from
            ``EAGLEEYE_LR_SCALING`` (``sqrt`` or ``none``).
        save_checkpoint: for the controller's ``checkpoint`` command: saves the script's
            checkpoint (with ``manager.state_dict()``) after the given step and returns
            where; called on the ranks of the epoch's source replica. Without it the
            command is refused (the script saves on its own schedule).
        load_checkpoint: for the controller's ``rollback`` command: loads the newest
            checkpoint at or before the given step (calling ``manager.load_state_dict``)
            and returns its step, or None when there is none. Without it: refused.
    """

    def __init__(
        self,
        state_dict: Callable[[], Mapping[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
        comm: ReplicaComm | None = None,
        lr_scaling: bool | None = None,
        save_checkpoint: Callable[[int], str] | None = None,
        load_checkpoint: Callable[[int], int | None] | None = None,
    ) -> None:
        self._save_checkpoint = save_checkpoint
        self._load_checkpoint = load_checkpoint
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        if lr_scaling is None:
            lr_scaling = os.environ.get(ENV_LR_SCALING, "sqrt") != "none"
        self.comm = comm if comm is not None else _comm_from_env(state_dict, lr_scaling)
        self.comm.lr_scaling = lr_scaling
        self.step = 0
        self.batch = 0
        self.lr_factor = 1.0
        self._marks = [0] * self.comm.num_replicas  # the ledger positions last looked up
        self.skipped: list[int] = []  # batches the controller's skip_batch skipped here
        self.joined_at: int | None = None
        self._started = False
        self._restored = False
        self._apply: Apply | None = None
        self._last: ExchangeResult | None = None
        self._trained_batch: int | None = None  # the batch the last committed step trained
        self._late_mark: int | None = None  # see load_state_dict

    # ---- where this rank sits --------------------------------------------------------------
    @property
    def replica(self) -> int:
        return self.comm.replica

    @property
    def num_replicas(self) -> int:
        return self.comm.num_replicas

    @property
    def replica_rank(self) -> int:
        return self.comm.replica_rank

    @property
    def replica_size(self) -> int:
        return self.comm.replica_size

    def current_step(self) -> int:
        """The next step to train (after a catch-up: the step the replica joined at)."""
        return self.step

    def is_saving_rank(self) -> bool:
        """Whether this rank saves the job's checkpoint: rank 0 of the epoch's source (the
        lowest healthy replica). Healthy replicas hold bitwise the same state, so one
        saves for all."""
        return self.replica_rank == 0 and self.comm.membership.source == self.replica

    def is_saving_replica(self) -> bool:
        """Whether this rank's replica saves for all (every rank of it saves its share of a
        sharded checkpoint, such as ``Snapshots``)."""
        return self.comm.membership.source == self.replica

    # ---- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What to save beside the model: the step and every replica's data position, so
        a job restarted from this checkpoint trains each batch once since."""
        self._marks = [
            self.comm.next_batch(mark, replica) for replica, mark in enumerate(self._marks)
        ]
        return {"step": self.step, "marks": list(self._marks), "lr_factor": self.lr_factor}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a ``state_dict`` from the script's checkpoint. A replica that must catch
        up from a peer ignores it (the peer's state replaces the checkpoint's)."""
        if self.comm.must_join:
            return
        self.step = int(state["step"])
        self.lr_factor = float(state.get("lr_factor", 1.0))
        marks = [int(m) for m in state["marks"]]
        if len(marks) == self.num_replicas:
            self._marks = list(marks)
        mark = marks[self.replica] if self.replica < len(marks) else 0
        self.comm.barrier()  # every rank read the ledger before rank 0 rewrites it
        self.comm.forget_batches(mark)
        self.comm.barrier()  # and reads it again only once rank 0 has rewritten it
        self.batch = self.comm.next_batch(mark)
        self._restored = True
        # A rollback runs on every replica after the same step, each as it commits it.
        # Every replica marks the batches of every contributor to that step, so one that
        # writes its marks after this replica forgot its batches marks this replica's
        # batch of that step again. Each replica has written its marks once the next
        # exchange is over (it enters that only after its own commit): the stale mark is
        # removed then (``commit``).
        trained = self._trained_batch
        self._late_mark = trained if trained is not None and trained >= mark else None

    def set_apply(self, apply: Apply) -> None:
        """How to apply one averaged update with a learning rate (``OptimizerWrapper``
        registers its own): the same code trains and replays, so a joiner that replays the
        logged steps ends bitwise equal to its source."""
        self._apply = apply

    # ---- the step -------------------------------------------------------------------------
    def begin_step(self) -> int:
        """Called before each step's forward pass. The first call joins the quorum: a
        relaunched replica catches up from a peer here. Returns the step."""
        if not self._started:
            self._start()
        return self.step

    def _start(self) -> None:
        self._started = True
        if self.comm.must_join:
            if self._apply is None:
                raise RuntimeError(
                    "the manager cannot catch up without an optimizer to replay steps with; "
                    "wrap the optimizer in OptimizerWrapper(manager, optimizer) first"
                )
            from ft_runtime.replica import restore_priority

            self.step = self.comm.join(self._load, self._apply, ready=restore_priority)
            self.joined_at = self.step
            self.batch = self.comm.next_batch()
        elif not self._restored:
            if self.comm.incarnation > 0:  # relaunched with the whole job, no checkpoint
                self.comm.forget_batches(0)
            self.batch = self.comm.next_batch()

    def _load(self, state: dict[str, Any]) -> None:
        self._load_state_dict(state)

    @property
    def joining(self) -> bool:
        """Whether this step is the replica's first after a catch-up (it sends zeros)."""
        return self.joined_at is not None and self.joined_at == self.step

    def allreduce(self, flat: torch.Tensor) -> StepResult:
        """Averages ``flat`` (this rank's gradient, flattened) over the contributing
        replicas in place; returns once the replica committed this step."""
        self.begin_step()
        result = self.comm.exchange(flat, self.step, self.batch)
        self._last = result
        return StepResult(
            self.step,
            result.lr_scale * self.lr_factor,
            result.contributors,
            result.members,
            result.epoch,
            result.retries,
        )

    def should_commit(self) -> bool:
        """Whether the last exchange committed (the exchange returns only once the replica
        agreed, so after ``allreduce`` returned this is True)."""
        return self._last is not None

    def commit(self, update: torch.Tensor, lr: float) -> None:
        """After the optimizer applied ``update`` with ``lr``: serves a catch-up if this
        rank is a source, advances the ledger, runs the controller's commands."""
        self.comm.after_step(self.step, update, lr)
        result, self._last = self._last, None
        if result is not None:
            self._audit(result)
        trained = result is not None and not self.joining
        if result is not None and self._late_mark is not None:
            if self._late_mark > self.batch:  # not trained again yet: a stale mark
                self.comm.unmark_batch(self._late_mark)
            self._late_mark = None
        if trained:
            self._trained_batch = self.batch
            self.batch = self.comm.next_batch(self.batch + 1)
        self.step += 1
        self._run_commands()

    def _audit(self, result: ExchangeResult) -> None:
        folder = os.environ.get(ENV_LEDGER_LOG, "")
        if not folder or self.replica_rank != 0:
            return
        name = f"replica-{self.replica}-{self.comm.incarnation}.jsonl"
        line = {"step": self.step, "epoch": result.epoch, "trained": result.trained}
        with open(os.path.join(folder, name), "a") as out:
            out.write(json.dumps(line) + "\n")

    def _run_commands(self) -> None:
        for command in self.comm.commands():
            self._run(command)

    def _run(self, command: Command) -> None:
        if command.kind == CHECKPOINT:
            self._checkpoint(command)
        elif command.kind == ROLLBACK:
            self._rollback(command)
        elif command.applies_to(self.replica):  # skip_batch
            self.comm.skip_batch(self.batch)
            self.skipped.append(self.batch)
            self.comm.answer(command, Skipped(self.batch))
            self.batch = self.comm.next_batch(self.batch + 1)
        else:
            self.comm.answer(command, Refused("skip_batch names other replicas"))

    def _checkpoint(self, command: Command) -> None:
        trained = self.step - 1  # the step just committed
        if self._save_checkpoint is None:
            self.comm.answer(command, Refused("this script saves its own checkpoints"))
        elif self.comm.membership.source != self.replica:
            self.comm.answer(command, Refused("not the epoch's source: it saves"))
        else:
            try:
                path = self._save_checkpoint(trained)
            except Exception as exc:  # the save fails; training goes on
                self.comm.answer(command, Failed(f"{type(exc).__name__}: {exc}"[:1000]))
                return
            self.comm.answer(command, Saved(trained, path))

    def _rollback(self, command: Command) -> None:
        if self._load_checkpoint is None:
            self.comm.answer(command, Refused("this script restores its own checkpoints"))
            return
        before, factor = self.step - 1, self.lr_factor  # every rollback's factor is kept
        try:
            restored = self._load_checkpoint(command.step)
        except Exception as exc:  # the rollback fails; training goes on
            self.comm.answer(command, Failed(f"{type(exc).__name__}: {exc}"[:1000]))
            return
        if restored is None:
            self.comm.answer(command, Failed(f"no checkpoint at or before {command.step}"))
            return
        self.lr_factor = factor * command.lr_factor
        self.comm.answer(command, Restored(restored, before, self.lr_factor))

    def close(self) -> None:
        self.comm.close()


def _comm_from_env(state_fn: Callable[[], Mapping[str, Any]], lr_scaling: bool) -> ReplicaComm:
    env = os.environ
    address = env.get(ENV_QUORUM, "")
    if not address:
        raise RuntimeError(
            f"{ENV_QUORUM} is not set: a replica manager runs under "
            "`eagleeye run --recovery replica`, which starts the quorum and sets it"
        )
    store = connect(address, JobSecret.from_env(), timeout_s=60.0)
    return ReplicaComm(
        store,
        address,
        replica=int(env.get(ENV_REPLICA, 0)),
        replica_rank=int(env.get(ENV_REPLICA_RANK, 0)),
        replica_size=int(env.get(ENV_REPLICA_SIZE, 1)),
        num_replicas=int(env.get(ENV_NUM_REPLICAS, 1)),
        incarnation=int(env.get(ENV_ATTEMPT, 0)),
        state_fn=state_fn,
        cross_timeout_s=float(env.get(ENV_CROSS_TIMEOUT, 30.0)),
        lr_scaling=lr_scaling,
        token=env.get(ENV_CATCHUP_TOKEN, ""),
        serve_nice=int(env.get(ENV_SERVE_NICE, SERVE_NICE)),
        serve_host=env.get(ENV_CATCHUP_HOST, "127.0.0.1"),
    )
