"""Replica recovery (FT-HSDP): replicas fail, restart and rejoin while the others train.

The rank side, for training scripts (docs/replica-api.md):

- ``Manager``: quorum membership, the fault-tolerant all-reduce and its two-phase commit,
  catch-up as joiner and as source, lr scaling, the exactly-once data ledger;
- ``OptimizerWrapper``: an optimizer whose ``step()`` applies only what the replicas
  agreed on;
- ``init_process_group``: the replica's own group, for ``DistributedDataParallel``;
- ``ReplicaSampler``: the data ledger as a sampler;
- ``Snapshots``: the saving replica's checkpoints through the job's snapshot holders.

The controller side: ``supervisor`` restarts one failed replica while the others keep
training; ``state`` is its record of each replica; ``inflight`` carries control commands
to the ranks without blocking the controller. ``protocol`` names every key of the quorum's
store and the messages under them (no torch needed); ``auth`` and ``store`` protect them
with the job's secret. Names are imported lazily, so that ``ft_runtime.replica.protocol``
loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ft_runtime.priority import restore_priority
from ft_runtime.replica.state import ReplicaState

if TYPE_CHECKING:
    from ft_runtime.replica.data import ReplicaSampler
    from ft_runtime.replica.ddp import init_process_group
    from ft_runtime.replica.manager import Manager, StepResult
    from ft_runtime.replica.optim import OptimizerWrapper
    from ft_runtime.replica.snapshots import Snapshots
    from ft_runtime.replica.supervisor import ReplicaSupervisor

_WHERE = {
    "Manager": "manager",
    "StepResult": "manager",
    "OptimizerWrapper": "optim",
    "ReplicaSampler": "data",
    "init_process_group": "ddp",
    "ReplicaSupervisor": "supervisor",
    "Snapshots": "snapshots",
}

__all__ = [
    "Manager",
    "OptimizerWrapper",
    "ReplicaSampler",
    "ReplicaState",
    "ReplicaSupervisor",
    "Snapshots",
    "StepResult",
    "init_process_group",
    "restore_priority",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        module = importlib.import_module(f"ft_runtime.replica.{_WHERE[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
