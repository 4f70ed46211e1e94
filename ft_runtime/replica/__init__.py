"""Replica recovery (FT-HSDP): the controller's supervisor of data-parallel replicas.

``supervisor`` restarts one failed replica while the others keep training; the rank side of
the protocol lives beside it in this package.
"""

from __future__ import annotations

from ft_runtime.replica.supervisor import ReplicaSupervisor, restore_priority

__all__ = ["ReplicaSupervisor", "restore_priority"]
