"""The fault-tolerant training runtime: launcher, supervisors, quorum, fault-tolerant
all-reduce, catch-up, checkpoints, fault injection.

Depends on nothing else of Eagle Eye and can be used alone. The modules that need torch
(``ftar``, ``quorum``, ``catchup``, ``rejoin``, ``replica``, ``checkpoint``) are imported by
name, so that importing the records here stays cheap.
"""

from __future__ import annotations

from ft_runtime.base import Runtime
from ft_runtime.errors import (
    CatchUpError,
    CheckpointError,
    CheckpointsUnusable,
    FaultSpecError,
    FTRuntimeError,
    LaunchError,
    LeftQuorum,
    RestartBudgetExceeded,
)
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase

__all__ = [
    "Action",
    "ActionKind",
    "CatchUpError",
    "CheckpointError",
    "CheckpointsUnusable",
    "FTRuntimeError",
    "FaultSpecError",
    "LaunchError",
    "LeftQuorum",
    "LifecycleEvent",
    "Outcome",
    "OutcomeStatus",
    "Phase",
    "RestartBudgetExceeded",
    "Runtime",
]
