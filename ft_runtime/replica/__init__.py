"""Replica recovery (FT-HSDP): the controller's supervisor of data-parallel replicas.

``supervisor`` restarts one failed replica while the others keep training; ``state`` is
its record of each replica; ``inflight`` carries control commands to the ranks without
blocking, and ``answers`` parses what the ranks answer. The rank side of the protocol
lives beside it in this package.
"""

from __future__ import annotations

from ft_runtime.priority import restore_priority
from ft_runtime.replica.answers import Answer, parse_answer
from ft_runtime.replica.state import ReplicaState
from ft_runtime.replica.supervisor import ReplicaSupervisor

__all__ = ["Answer", "ReplicaState", "ReplicaSupervisor", "parse_answer", "restore_priority"]
