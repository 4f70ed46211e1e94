"""Fakes of the runtime for tests of the layers above it (remediation, the controller)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ft_runtime.types import Action, Outcome, OutcomeStatus


class FakeRuntime:
    """Records every action it receives and answers with a scripted status.

    >>> from ft_runtime.types import ActionKind
    >>> rt = FakeRuntime()
    >>> rt.execute(Action(ActionKind.NOTIFY, "job", "test", "k")).status.value
    'done'
    >>> len(rt.actions)
    1
    """

    def __init__(
        self,
        status: OutcomeStatus = OutcomeStatus.DONE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.status = status
        self.clock = clock
        self.actions: list[Action] = []

    def execute(self, action: Action) -> Outcome:
        self.actions.append(action)
        return Outcome(action, self.status, "fake runtime", self.clock())
