"""Turns findings into actions, executes them through the runtime, keeps the audit trail.

Safety first: in dry-run (the default) actions are decided and recorded but not executed.
A repeated action (same idempotency key) is executed once. A finding that predates the last
executed action on the same target is already answered (the job was restarted after it)
and gets no new action. User hooks see every finding and decision; a hook that raises is
logged and never stops remediation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from detectors.types import Finding
from ft_runtime.base import Runtime
from ft_runtime.types import Action, Outcome, OutcomeStatus
from remediation.policy import Policy

log = logging.getLogger(__name__)
FindingHook = Callable[[Finding], None]
DecisionHook = Callable[["Decision"], None]


@dataclass(frozen=True, slots=True)
class Decision:
    """One action taken for one finding, with its outcome."""

    finding: Finding
    action: Action
    outcome: Outcome
    decided_at: float
    dry_run: bool


class Remediator:
    """Args:
    policy: rules from finding to action.
    runtime: executes actions when ``dry_run`` is False.
    dry_run: decide and record only (the default).
    clock: wall-clock time, seconds.
    """

    def __init__(
        self,
        policy: Policy,
        runtime: Runtime,
        dry_run: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.runtime = runtime
        self.dry_run = dry_run
        self.clock = clock
        self._keys: set[str] = set()
        self._last_done: dict[str, float] = {}
        self._finding_hooks: list[FindingHook] = []
        self._decision_hooks: list[DecisionHook] = []

    def on_finding(self, hook: FindingHook) -> FindingHook:
        self._finding_hooks.append(hook)
        return hook

    def on_decision(self, hook: DecisionHook) -> DecisionHook:
        self._decision_hooks.append(hook)
        return hook

    def handle(self, finding: Finding) -> list[Decision]:
        _call_all(self._finding_hooks, finding)
        decisions = []
        for rule in self.policy.decide(finding):
            target = rule.target(finding)
            if finding.time <= self._last_done.get(target, float("-inf")):
                continue  # the target was recovered after this finding: already answered
            key = f"{rule.action.value}/{target}/{finding.key}@{finding.time:.6f}"
            action = Action(
                rule.action,
                target,
                f"{finding.kind} on {finding.subject} ({self.policy.name})",
                key,
            )
            decided_at = self.clock()
            outcome = self._execute(action)
            if outcome.status is OutcomeStatus.DONE:
                self._last_done[target] = outcome.time
            decision = Decision(finding, action, outcome, decided_at, self.dry_run)
            _call_all(self._decision_hooks, decision)
            decisions.append(decision)
        return decisions

    def _execute(self, action: Action) -> Outcome:
        if action.key in self._keys:
            return Outcome(action, OutcomeStatus.SKIPPED, "duplicate action", self.clock())
        self._keys.add(action.key)
        if self.dry_run:
            return Outcome(
                action, OutcomeStatus.SKIPPED, "dry-run: remediation not enabled", self.clock()
            )
        try:
            return self.runtime.execute(action)
        except Exception as exc:  # a runtime that raises still yields an outcome
            log.exception("runtime raised while executing %s", action)
            return Outcome(action, OutcomeStatus.FAILED, f"runtime error: {exc}", self.clock())


def _call_all(hooks: list[FindingHook] | list[DecisionHook], value: Any) -> None:
    for hook in hooks:
        try:
            hook(value)
        except Exception:
            log.exception("remediation hook %r raised; ignored", hook)
