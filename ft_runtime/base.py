"""The runtime's control protocol, as seen by remediation and the controller."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase

log = logging.getLogger(__name__)


@runtime_checkable
class Runtime(Protocol):
    """Executes actions. Returns an Outcome instead of raising: a failed action is data.
    An action that takes longer than a tick (a command every replica must answer) returns
    a ``PENDING`` outcome at once; its final Outcome comes later from ``outcomes()`` of
    the supervisor that executed it."""

    def execute(self, action: Action) -> Outcome: ...


class Supervisor(Runtime, Protocol):
    """What the controller drives, one tick at a time, from one thread: the synchronous
    ``JobSupervisor`` and the ``ReplicaSupervisor`` both are one."""

    attempt: int
    phase: Phase
    attempt_env: Callable[[int], Mapping[str, str]]

    def start(self) -> None: ...

    def poll(self) -> list[LifecycleEvent]:
        """Exits, launches and membership changes since the last call; never blocks."""
        ...

    def settle(self) -> list[LifecycleEvent]:
        """After the tick's actions ran: what follows from them (a failed job, a restart)."""
        ...

    def outcomes(self) -> list[Outcome]:
        """Final outcomes of actions that were pending, since the last call."""
        ...

    def look_now(self) -> bool:
        """Whether something is to be judged now rather than at the next tick (a stopped
        rank that others wait for); cheap, records nothing. The controller asks while it
        waits for telemetry and then ticks at once."""
        ...

    def stop(self, reason: str, grace_s: float = 0.0) -> None: ...

    def stop_all(self, grace_s: float | None = None) -> None: ...

    def stop_restarting(self, reason: str) -> None: ...

    def log_path(self, rank: int) -> Path | None: ...

    def alive(self) -> int: ...

    def pids(self) -> dict[int, int]: ...

    @property
    def finished(self) -> bool: ...


def answer_before_acting(
    action: Action, done_keys: set[str], now: float, unsupported: str
) -> Outcome | None:
    """What a restarting supervisor answers before it acts, or None when it is to act: an
    action already executed is skipped, a notice is logged (once), any kind but a restart
    is skipped with ``unsupported``."""
    if action.key in done_keys:
        return Outcome(action, OutcomeStatus.SKIPPED, "duplicate of an executed action", now)
    if action.kind is ActionKind.NOTIFY:
        done_keys.add(action.key)
        log.warning("eagleeye notice: %s", action.reason)
        return Outcome(action, OutcomeStatus.DONE, "logged", now)
    if action.kind is not ActionKind.RESTART:
        return Outcome(action, OutcomeStatus.SKIPPED, unsupported, now)
    return None
