"""The runtime's control protocol, as seen by remediation."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ft_runtime.types import Action, Outcome


@runtime_checkable
class Runtime(Protocol):
    """Executes actions. Returns an Outcome instead of raising: a failed action is data."""

    def execute(self, action: Action) -> Outcome: ...
