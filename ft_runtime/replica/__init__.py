"""Replica recovery (FT-HSDP): the controller's supervisor of data-parallel replicas.

``supervisor`` restarts one failed replica while the others keep training; ``state`` is
its record of each replica; ``inflight`` carries control commands to the ranks without
blocking the controller; ``protocol`` names every key of the quorum's store and the
messages under them (no torch needed). The rank side of the protocol lives beside them in
this package. Names are imported lazily, so that ``ft_runtime.replica.protocol`` loads
without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ft_runtime.priority import restore_priority
from ft_runtime.replica.state import ReplicaState

if TYPE_CHECKING:
    from ft_runtime.replica.supervisor import ReplicaSupervisor

__all__ = ["ReplicaState", "ReplicaSupervisor", "restore_priority"]


def __getattr__(name: str) -> Any:
    if name == "ReplicaSupervisor":
        from ft_runtime.replica import supervisor

        return supervisor.ReplicaSupervisor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
