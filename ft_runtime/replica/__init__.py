"""Replica recovery (FT-HSDP): the controller's supervisor of data-parallel replicas.

``supervisor`` restarts one failed replica while the others keep training; ``protocol``
names every key of the quorum's store and the messages under them (no torch needed). The
rank side of the protocol lives beside them in this package. Names are imported lazily, so
that ``ft_runtime.replica.protocol`` loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ft_runtime.replica.supervisor import ReplicaSupervisor, restore_priority

__all__ = ["ReplicaSupervisor", "restore_priority"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ft_runtime.replica import supervisor

        return getattr(supervisor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
