"""Turns findings into actions, executes them through the runtime, keeps the audit trail.

Safety first: in dry-run (the default) actions are decided and recorded but not executed.
A repeated action (same idempotency key) is executed once. A finding that predates the last
recovery (restart, eviction, rollback, isolation) of its target is already answered and
gets no new action. Each rule escalates along its ladder as the same fault repeats; a
cooldown, a rate limit, a retry cap or a pending approval turns an action into a skipped
decision that says why. User hooks see every finding and decision; a hook that raises is
logged and never stops remediation. An action that the runtime answers as pending (a
command every replica must answer) is decided at once; its final outcome comes later
through ``complete``, which makes a second decision for the same finding and action. The
methods are thread-safe (the webhook and the controller call them from different threads).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from detectors.types import Finding
from ft_runtime.base import Runtime
from ft_runtime.types import Action, ActionKind, Outcome, OutcomeStatus
from remediation._limits import Cooldowns, Incident, Incidents, RateLimiter
from remediation.errors import RemediationError
from remediation.hooks import DEFAULT_HOOKS, Hooks
from remediation.policy import Policy, Rule, Rung, Step, target_of

log = logging.getLogger(__name__)
FindingHook = Callable[[Finding], None]
DecisionHook = Callable[["Decision"], None]
# Actions after which the target is a new incarnation: older findings about it are answered.
NEVER = float("-inf")
JOB = "job"  # the target of the whole job: recovered, every finding before is answered
RECOVERIES = frozenset(
    {ActionKind.RESTART, ActionKind.EVICT, ActionKind.ROLLBACK, ActionKind.ISOLATE}
)


@dataclass(frozen=True, slots=True)
class Decision:
    """One action decided for one finding, its outcome, and why it was decided."""

    finding: Finding
    action: Action
    outcome: Outcome
    decided_at: float
    dry_run: bool
    reason: str = ""
    params: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "finding": self.finding.to_json(),
            "outcome": self.outcome.to_json(),
            "decided_at": self.decided_at,
            "dry_run": self.dry_run,
            "reason": self.reason,
            "params": dict(self.params),
        }


@dataclass(frozen=True, slots=True)
class PendingAction:
    """An action waiting for a person: approve or reject it by ``id``."""

    id: int
    finding: Finding
    action: Action
    reason: str
    params: Mapping[str, float]
    since: float


class Remediator:
    """Args:
    policy: rules from finding to actions, limits and approval.
    runtime: executes actions when not in dry-run.
    dry_run: decide and record only; None takes the policy's (True unless it says otherwise).
    clock: wall-clock time, seconds.
    hooks: finding and action hooks; the module-level ``on_finding``/``on_action`` by default.
    """

    def __init__(
        self,
        policy: Policy,
        runtime: Runtime,
        dry_run: bool | None = None,
        clock: Callable[[], float] = time.time,
        hooks: Hooks | None = None,
    ) -> None:
        self.policy = policy
        self.runtime = runtime
        self.dry_run = policy.dry_run if dry_run is None else dry_run
        self.clock = clock
        self.hooks = DEFAULT_HOOKS if hooks is None else hooks
        self._own = Hooks()  # hooks registered on this instance with on_finding(f)
        self._lock = threading.RLock()
        self._keys: set[str] = set()
        self._last_done: dict[str, float] = {}
        self._incidents = Incidents()
        self._cooldowns = Cooldowns()
        self._limiter = RateLimiter(policy.limits)
        self._pending: dict[int, PendingAction] = {}
        self._next_id = 1
        self._running: dict[str, tuple[PendingAction, str]] = {}  # by key: under way

    def on_finding(self, hook: FindingHook) -> FindingHook:
        return self._own.on_finding()(hook)

    def on_decision(self, hook: DecisionHook) -> DecisionHook:
        return self._own.on_action()(hook)

    def handle(self, finding: Finding) -> list[Decision]:
        """Decides, executes (unless dry-run) and returns the decisions for one finding."""
        self._own.finding(finding)
        self.hooks.finding(finding)
        with self._lock:
            decisions: list[Decision] = []
            for index, rule in enumerate(self.policy.rules):
                if rule.matches(finding):
                    decisions += self._apply(index, rule, finding)
        for decision in decisions:
            self._notify(decision)
        return decisions

    def pending(self) -> list[PendingAction]:
        """Actions waiting for approval, oldest first."""
        with self._lock:
            return sorted(self._pending.values(), key=lambda p: p.id)

    def approve(self, pending_id: int) -> Decision:
        """Executes a pending action (still a dry run in dry-run mode).

        Raises:
            RemediationError: no action with that id is pending.
        """
        with self._lock:
            item = self._take(pending_id)
            outcome = self._run(item.action)
            decision = self._decision(item, outcome, f"{item.reason}; approved")
            self._note_running(decision)
        self._notify(decision)
        return decision

    def reject(self, pending_id: int, why: str = "") -> Decision:
        """Drops a pending action; the decision records the rejection and ``why``."""
        with self._lock:
            item = self._take(pending_id)
            detail = f"rejected by operator{': ' + why if why else ''}"
            outcome = Outcome(item.action, OutcomeStatus.SKIPPED, detail, self.clock())
            decision = self._decision(item, outcome, item.reason)
        self._notify(decision)
        return decision

    def _apply(self, index: int, rule: Rule, finding: Finding) -> list[Decision]:
        incident = self._incidents.see(
            index, finding.key, finding.time, finding.step, rule.reset_after_s
        )
        rung = rule.rung_for(incident.count, incident.steps)
        if rung is None:
            return []
        level = rule.ladder.index(rung)
        reason = (
            f"{finding.kind} on {finding.subject} seen {incident.count}x over "
            f"{incident.steps} steps: rung {level + 1}/{len(rule.ladder)} ({self.policy.name})"
        )
        capped = rung.max_times is not None and incident.fired.get(level, 0) >= rung.max_times
        decisions = [
            d
            for step in rung.steps
            if (d := self._step(index, rule, rung, step, finding, reason, capped)) is not None
        ]
        if any(_acted(d) for d in decisions):
            incident.fired[level] = incident.fired.get(level, 0) + 1
        return decisions

    def _step(
        self,
        index: int,
        rule: Rule,
        rung: Rung,
        step: Step,
        finding: Finding,
        reason: str,
        capped: bool,
    ) -> Decision | None:
        target = target_of(step.scope, finding)
        recovered = max(self._last_done.get(target, NEVER), self._last_done.get(JOB, NEVER))
        if finding.time <= recovered:
            return None  # the target (or the whole job) was recovered after this finding
        key = f"{step.action.value}/{target}/{finding.key}@{finding.time:.6f}"
        action = Action(step.action, target, reason, key, tuple(sorted(step.params.items())))
        now = self.clock()
        item = PendingAction(0, finding, action, reason, step.params, now)
        refusal = self._refusal(index, action, now, capped, rung)
        if refusal is not None:
            outcome = Outcome(action, OutcomeStatus.SKIPPED, refusal, now)
            return self._decision(item, outcome, reason)
        self._keys.add(key)
        self._cooldowns.start(index, target, now, rule.cooldown_s)
        if step.action in self.policy.approval:
            item = PendingAction(self._next_id, finding, action, reason, step.params, now)
            self._pending[item.id] = item
            self._next_id += 1
            detail = f"awaiting approval (pending #{item.id})"
            return self._decision(item, Outcome(action, OutcomeStatus.SKIPPED, detail, now), reason)
        decision = self._decision(item, self._run(action), reason)
        self._note_running(decision)
        return decision

    def complete(self, outcome: Outcome) -> Decision | None:
        """Takes the final outcome of an action the runtime had answered as pending; returns
        its decision (hooks see it like any other), or None for an action not under way."""
        with self._lock:
            running = self._running.pop(outcome.action.key, None)
            if running is None or not outcome.final:
                return None
            item, reason = running
            self._note_recovery(outcome)
            decision = self._decision(item, outcome, reason)
        self._notify(decision)
        return decision

    def running(self) -> int:
        """How many executed actions are still under way."""
        with self._lock:
            return len(self._running)

    def _note_running(self, decision: Decision) -> None:
        if not decision.outcome.final:
            item = PendingAction(
                0,
                decision.finding,
                decision.action,
                decision.reason,
                decision.params,
                decision.decided_at,
            )
            self._running[decision.action.key] = (item, decision.reason)

    def _refusal(
        self, index: int, action: Action, now: float, capped: bool, rung: Rung
    ) -> str | None:
        if action.key in self._keys:
            return "duplicate action"
        if capped:
            return f"retry cap: this rung already fired {rung.max_times} times"
        return self._cooldowns.refusal(index, action.target, now) or self._limiter.refusal(
            action.kind, now
        )

    def _run(self, action: Action) -> Outcome:
        self._limiter.record(action.kind, self.clock())
        if self.dry_run:
            return Outcome(
                action, OutcomeStatus.SKIPPED, "dry-run: remediation not enabled", self.clock()
            )
        try:
            outcome = self.runtime.execute(action)
        except Exception as exc:  # a runtime that raises still yields an outcome
            log.exception("runtime raised while executing %s", action)
            return Outcome(action, OutcomeStatus.FAILED, f"runtime error: {exc}", self.clock())
        self._note_recovery(outcome)
        return outcome

    def _note_recovery(self, outcome: Outcome) -> None:
        """A target recovered: findings about it from before are answered."""
        if outcome.status is OutcomeStatus.DONE and outcome.action.kind in RECOVERIES:
            self._last_done[outcome.action.target] = outcome.time
            if outcome.action.kind is ActionKind.RESTART and "attempt" in outcome.data:
                # a restart that became the whole job's (a new attempt): every rank recovered
                self._last_done[JOB] = outcome.time

    def _decision(self, item: PendingAction, outcome: Outcome, reason: str) -> Decision:
        return Decision(
            item.finding, item.action, outcome, item.since, self.dry_run, reason, item.params
        )

    def _take(self, pending_id: int) -> PendingAction:
        item = self._pending.pop(pending_id, None)
        if item is None:
            known = ", ".join(str(i) for i in sorted(self._pending)) or "none"
            raise RemediationError(f"no pending action #{pending_id} (pending: {known})")
        return item

    def _notify(self, decision: Decision) -> None:
        self._own.decision(decision)
        self.hooks.decision(decision)


def _acted(decision: Decision) -> bool:
    """Whether the decision counts as the rung firing (dry-run and approval requests do)."""
    detail = decision.outcome.detail
    return decision.outcome.status is not OutcomeStatus.SKIPPED or not detail.startswith(
        ("duplicate", "retry cap", "cooldown", "rate limit")
    )


__all__ = ["RECOVERIES", "Decision", "Incident", "PendingAction", "Remediator"]
