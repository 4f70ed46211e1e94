"""Policies: which action answers which finding.

A rule matches a finding kind (and optionally a minimum severity) and names an action kind
and the scope it targets: the finding's own subject, its replica, its node or the whole job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from detectors.types import Finding, Severity
from ft_runtime.types import ActionKind
from remediation.errors import PolicyError

SCOPES = ("job", "replica", "node", "subject")
_RANKED = (Severity.INFO, Severity.WARN, Severity.CRITICAL)


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    action: ActionKind
    scope: str = "job"
    min_severity: Severity = Severity.INFO

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise PolicyError(
                f"rule for {self.kind!r}: scope {self.scope!r} is not one of {', '.join(SCOPES)}"
            )

    def matches(self, finding: Finding) -> bool:
        return finding.kind == self.kind and _RANKED.index(finding.severity) >= _RANKED.index(
            self.min_severity
        )

    def target(self, finding: Finding) -> str:
        """The runtime's name for what the action applies to."""
        subject = finding.subject
        if self.scope == "replica" and subject.replica is not None:
            return f"replica:{subject.replica}"
        if self.scope == "node" and subject.node is not None:
            return f"node:{subject.node}"
        if self.scope == "subject" and subject.scope != "job":
            value = {"rank": subject.rank, "node": subject.node, "replica": subject.replica}[
                subject.scope
            ]
            return f"{subject.scope}:{value}"
        return "job"


@dataclass(frozen=True, slots=True)
class Policy:
    """An ordered list of rules; every rule that matches a finding yields an action."""

    rules: Sequence[Rule] = field(default_factory=tuple)
    name: str = "custom"

    def decide(self, finding: Finding) -> list[Rule]:
        return [rule for rule in self.rules if rule.matches(finding)]


def synchronous_restart_policy() -> Policy:
    """The built-in policy of synchronous recovery: a dead or hung rank restarts the job
    from its last checkpoint; a non-finite loss is reported (the step is already skipped)."""
    return Policy(
        rules=(
            Rule("process_exit", ActionKind.RESTART, "job", Severity.CRITICAL),
            Rule("hang", ActionKind.RESTART, "job", Severity.CRITICAL),
            Rule("nan", ActionKind.NOTIFY, "subject"),
        ),
        name="built-in synchronous-restart",
    )


def replica_restart_policy() -> Policy:
    """The built-in policy of replica recovery: a dead or hung rank costs only its replica,
    which is restarted and catches up from a healthy peer while the others train on."""
    return Policy(
        rules=(
            Rule("process_exit", ActionKind.RESTART, "replica", Severity.CRITICAL),
            Rule("hang", ActionKind.RESTART, "replica", Severity.CRITICAL),
            Rule("nan", ActionKind.NOTIFY, "subject"),
        ),
        name="built-in replica-restart",
    )
