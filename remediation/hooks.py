"""User hooks: callables that see findings and decisions; one that raises never stops anything.

>>> hooks = Hooks()
>>> seen = []
>>> @hooks.on_finding(kind="nan")
... def record(finding):
...     seen.append(finding.kind)
>>> len(hooks.finding_hooks)
1

The module-level ``on_finding`` and ``on_action`` register on ``DEFAULT_HOOKS``, which
every Remediator built without its own ``hooks`` calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from detectors.types import Finding

if TYPE_CHECKING:
    from remediation.remediator import Decision

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class _Entry:
    func: Callable[[Any], None]
    kind: str | None


class Hooks:
    """A set of finding hooks and action hooks, each optionally filtered by kind."""

    def __init__(self) -> None:
        self.finding_hooks: list[_Entry] = []
        self.action_hooks: list[_Entry] = []

    def on_finding(self, kind: str | None = None) -> Callable[[F], F]:
        """Decorator: call the function with every finding (of ``kind`` when given)."""

        def register(func: F) -> F:
            self.finding_hooks.append(_Entry(func, kind))
            return func

        return register

    def on_action(self, kind: str | None = None) -> Callable[[F], F]:
        """Decorator: call the function with every Decision (whose action is ``kind``)."""

        def register(func: F) -> F:
            self.action_hooks.append(_Entry(func, kind))
            return func

        return register

    def clear(self) -> None:
        self.finding_hooks.clear()
        self.action_hooks.clear()

    def finding(self, finding: Finding) -> None:
        """Calls the finding hooks; exceptions are logged and swallowed."""
        for entry in self.finding_hooks:
            if entry.kind is None or entry.kind == finding.kind:
                _safely(entry.func, finding)

    def decision(self, decision: Decision) -> None:
        """Calls the action hooks; exceptions are logged and swallowed."""
        for entry in self.action_hooks:
            if entry.kind is None or entry.kind == decision.action.kind.value:
                _safely(entry.func, decision)


def _safely(func: Callable[[Any], None], value: Any) -> None:
    try:
        func(value)
    except Exception:
        # A user's hook must never stop the controller: log with the traceback, go on.
        log.exception("remediation hook %r raised; ignored", func)


DEFAULT_HOOKS = Hooks()
on_finding = DEFAULT_HOOKS.on_finding
on_action = DEFAULT_HOOKS.on_action
