"""The fault-tolerant training runtime: launcher, supervisor, checkpoints, fault injection.

Depends on nothing else of Eagle Eye and can be used alone.
"""

from __future__ import annotations

from ft_runtime.base import Runtime
from ft_runtime.errors import (
    CheckpointError,
    FaultSpecError,
    FTRuntimeError,
    LaunchError,
    RestartBudgetExceeded,
)
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase

__all__ = [
    "Action",
    "ActionKind",
    "CheckpointError",
    "FTRuntimeError",
    "FaultSpecError",
    "LaunchError",
    "LifecycleEvent",
    "Outcome",
    "OutcomeStatus",
    "Phase",
    "RestartBudgetExceeded",
    "Runtime",
]
