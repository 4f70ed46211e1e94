"""Replica recovery for PyTorch Lightning: ``Trainer(strategy=ReplicaStrategy())``.

Lightning owns the process group, the optimizer step and the stop; the strategy hands each
to the replica API (docs/replica-api.md):

- the process group is the replica's (``init_process_group``) and Lightning's ranks are
  the replica's ranks (``ReplicaEnvironment``), so its DDP averages inside the replica;
- the optimizer step is ``OptimizerWrapper.step`` around Lightning's closure (zero_grad,
  ``training_step``, backward, its ``on_before_optimizer_step`` hooks and gradient
  clipping): the gradient is averaged across replicas, applied and committed;
- ``Trainer(max_steps=N)`` counts the manager's steps, so a replica that caught up from a
  peer stops with it rather than N steps after its restart.

The data comes from ``ReplicaSampler(dataset, strategy.manager, batch_size)`` one batch at
a time. Lightning's loop fetches a batch ahead, before the step before it commits, and the
ledger would hand out a batch it has not moved past; so ``training_step`` takes
``dataloader_iter`` and calls ``next`` on it when it needs the batch (Lightning then
fetches nothing ahead). Learning-rate schedulers must follow ``manager.current_step()``
(as in the plain API); Lightning's own checkpoints would be written by rank 0 of every
replica, so save through ``Snapshots`` or on ``manager.is_saving_rank()`` instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.strategies import DDPStrategy

from ft_runtime.layout import ENV_REPLICA_RANK, ENV_REPLICA_SIZE
from ft_runtime.quorum import ENV_QUORUM
from ft_runtime.replica.ddp import init_process_group
from ft_runtime.replica.manager import Manager
from ft_runtime.replica.optim import OptimizerWrapper

__all__ = ["ReplicaEnvironment", "ReplicaStrategy"]


class ReplicaEnvironment(ClusterEnvironment):  # type: ignore[misc]
    """Lightning's view of the ranks: this replica's, started by ``eagleeye run``."""

    def __init__(self) -> None:
        super().__init__()
        self._rank = int(os.environ.get(ENV_REPLICA_RANK, 0))
        self._size = int(os.environ.get(ENV_REPLICA_SIZE, 1))

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", 0))

    @staticmethod
    def detect() -> bool:
        return bool(os.environ.get(ENV_QUORUM))

    def world_size(self) -> int:
        return self._size

    def set_world_size(self, size: int) -> None:
        """Lightning's count of the ranks; the replica's size is what the launcher set."""

    def global_rank(self) -> int:
        return self._rank

    def set_global_rank(self, rank: int) -> None:
        """Lightning's rank; the rank within the replica is what the launcher set."""

    def local_rank(self) -> int:
        return self._rank

    def node_rank(self) -> int:
        return 0

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices * num_nodes != self._size:
            raise ValueError(
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) does not match the "
                f"replica's {self._size} ranks: give devices={self._size}, num_nodes=1"
            )


class ReplicaStrategy(DDPStrategy):  # type: ignore[misc]
    """DDP inside the replica, replica recovery across replicas.

    Args:
        manager: the rank's replica manager; by default one whose state is the
            LightningModule's and its optimizer's (``strategy.manager``, for the sampler).
        process_group_backend: the replica's group (default ``gloo``).
        kwargs: as ``DDPStrategy`` takes them.
    """

    def __init__(
        self,
        manager: Manager | None = None,
        process_group_backend: str = "gloo",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            cluster_environment=ReplicaEnvironment(),
            process_group_backend=process_group_backend,
            **kwargs,
        )
        self.manager = manager if manager is not None else Manager(self._state, self._load)
        self.wrapper: OptimizerWrapper | None = None

    def _state(self) -> dict[str, Any]:
        return {
            "model": self.lightning_module.state_dict(),
            "optimizer": self.optimizers[0].state_dict(),
        }

    def _load(self, state: dict[str, Any]) -> None:
        self.lightning_module.load_state_dict(state["model"])
        self.optimizers[0].load_state_dict(state["optimizer"])

    def setup_distributed(self) -> None:
        self.cluster_environment.validate_settings(self.num_processes, self.num_nodes)
        if not torch.distributed.is_initialized():
            backend = self._get_process_group_backend()
            init_process_group(backend, timeout_s=self._timeout.total_seconds())
        super().setup_distributed()  # Lightning's own init sees the group and keeps it

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        if len(self.optimizers) != 1:
            raise ValueError(
                f"ReplicaStrategy trains one optimizer; configure_optimizers gave "
                f"{len(self.optimizers)}: return one (its param groups may differ)"
            )
        self.wrapper = OptimizerWrapper(self.manager, self.optimizers[0])

    def optimizer_step(
        self,
        optimizer: Any,
        closure: Callable[[], Any],
        model: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Lightning's closure, then the exchange across replicas, the update and the
        commit (``OptimizerWrapper.step``); stops at ``max_steps`` of the manager's count."""
        assert self.wrapper is not None, "the strategy's setup wraps the optimizer"
        model = model if model is not None else self.lightning_module
        result = self.precision_plugin.optimizer_step(
            self.wrapper, model=model, closure=closure, **kwargs
        )
        trainer = model.trainer
        if 0 <= trainer.max_steps <= self.manager.current_step():
            trainer.should_stop = True
        return result
