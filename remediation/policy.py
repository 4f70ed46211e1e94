"""Policies: which actions answer which finding, and how they escalate.

A rule matches a finding kind (optionally a minimum severity and the subject's scope) and
holds an action ladder: rungs that apply once the same fault has been seen ``after`` times
(or has persisted ``after_steps`` steps). Each rung names one or more actions and the scope
each targets: the finding's own subject, its replica, its node or the whole job.

>>> rule = Rule("slow_rank", ladder=(Rung((Step(ActionKind.NOTIFY, "subject"),)),
...     Rung((Step(ActionKind.EVICT, "node"),), after=3)))
>>> rule.rung_for(count=1, steps=0).steps[0].action.value, rule.rung_for(5, 0).steps[0].action.value
('notify', 'evict')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from detectors.types import Finding, Severity
from ft_runtime.types import ActionKind
from remediation.errors import PolicyError

SCOPES = ("job", "replica", "node", "subject")
SUBJECT_SCOPES = ("any", "job", "replica", "node", "rank")
_RANKED = (Severity.INFO, Severity.WARN, Severity.CRITICAL)


def target_of(scope: str, finding: Finding) -> str:
    """The runtime's name ("job", "replica:1", "node:n1", "rank:3") for ``scope`` of a finding."""
    subject = finding.subject
    if scope == "replica" and subject.replica is not None:
        return f"replica:{subject.replica}"
    if scope == "node" and subject.node is not None:
        return f"node:{subject.node}"
    if scope == "subject" and subject.scope != "job":
        value = {"rank": subject.rank, "node": subject.node, "replica": subject.replica}
        return f"{subject.scope}:{value[subject.scope]}"
    return "job"


@dataclass(frozen=True, slots=True)
class Step:
    """One action of a rung: its kind, the scope it targets and free parameters (lr_factor)."""

    action: ActionKind
    scope: str = "job"
    params: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise PolicyError(f"scope {self.scope!r} is not one of {', '.join(SCOPES)}")
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))


@dataclass(frozen=True, slots=True)
class Rung:
    """Actions taken together once a fault was seen ``after`` times or for ``after_steps``.

    ``max_times`` caps how often this rung fires per incident (a retry cap); past it the
    remediator records a skipped decision instead of acting again.
    """

    steps: Sequence[Step]
    after: int = 1
    after_steps: int = 0
    max_times: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        if not self.steps:
            raise PolicyError("a rung needs at least one action")
        if self.after < 1 or self.after_steps < 0:
            raise PolicyError("after must be at least 1 and after_steps at least 0")
        if self.max_times is not None and self.max_times < 1:
            raise PolicyError("max_times must be at least 1")


@dataclass(frozen=True, slots=True)
class Rule:
    """Matches findings and escalates through its ladder.

    ``Rule(kind, action, scope, min_severity)`` is the one-rung shorthand. ``cooldown_s``
    silences the rule on a target after it acted there; an incident (the count of one
    fault's findings) ends after ``reset_after_s`` without a finding.
    """

    kind: str
    action: ActionKind | None = None
    scope: str = "job"
    min_severity: Severity = Severity.INFO
    ladder: Sequence[Rung] = ()
    on: str = "any"
    cooldown_s: float = 0.0
    reset_after_s: float = 600.0

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise PolicyError(
                f"rule for {self.kind!r}: scope {self.scope!r} is not one of {', '.join(SCOPES)}"
            )
        if self.on not in SUBJECT_SCOPES:
            raise PolicyError(
                f"rule for {self.kind!r}: on {self.on!r} is not one of {', '.join(SUBJECT_SCOPES)}"
            )
        if self.cooldown_s < 0 or self.reset_after_s <= 0:
            raise PolicyError(f"rule for {self.kind!r}: cooldown_s and reset_after_s must be > 0")
        ladder = tuple(self.ladder)
        if not ladder:
            if self.action is None:
                raise PolicyError(f"rule for {self.kind!r} needs an action or a ladder")
            ladder = (Rung((Step(self.action, self.scope),)),)
        object.__setattr__(self, "ladder", tuple(sorted(ladder, key=lambda r: r.after)))

    def matches(self, finding: Finding) -> bool:
        if finding.kind != self.kind:
            return False
        if self.on != "any" and finding.subject.scope != self.on:
            return False
        return _RANKED.index(finding.severity) >= _RANKED.index(self.min_severity)

    def target(self, finding: Finding) -> str:
        """The target of the first rung's first action (the one-rung shorthand's target)."""
        return target_of(self.ladder[0].steps[0].scope, finding)

    def rung_for(self, count: int, steps: int) -> Rung | None:
        """The highest rung reached after ``count`` findings spanning ``steps`` steps."""
        reached = [r for r in self.ladder if count >= r.after and steps >= r.after_steps]
        return reached[-1] if reached else None


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``max`` executed actions of ``action`` per ``per_s`` seconds, job-wide."""

    action: ActionKind
    max: int
    per_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.max < 0 or self.per_s <= 0:
            raise PolicyError(f"limit on {self.action.value}: max >= 0 and per_s > 0 required")


@dataclass(frozen=True, slots=True)
class Policy:
    """An ordered list of rules; every rule that matches a finding may yield actions.

    Args:
        rules: the rules, in file order.
        name: shown in every action's reason.
        dry_run: the default of a Remediator built without an explicit ``dry_run``.
        limits: rate limits per action kind.
        approval: action kinds that wait for a person's approval.
        source: the file the policy came from, if any.
    """

    rules: Sequence[Rule] = field(default_factory=tuple)
    name: str = "custom"
    dry_run: bool = True
    limits: Sequence[Limit] = ()
    approval: frozenset[ActionKind] = frozenset()
    source: str = ""

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


#: A GPU beyond use evicts its host (the policies of jobs across hosts).
_HOST_EVICTIONS = (
    Rule("xid", ActionKind.EVICT, "node", Severity.CRITICAL),
    Rule("ecc", ActionKind.EVICT, "node", Severity.CRITICAL),
)


def cluster_restart_policy() -> Policy:
    """The built-in policy of a job across hosts (``eagleeye controller``): a dead or hung
    rank restarts the job on every host; a GPU beyond use (a critical XID, an uncorrectable
    memory error) evicts its host; a non-finite loss is reported."""
    return Policy(
        rules=(*synchronous_restart_policy().rules, *_HOST_EVICTIONS),
        name="built-in cluster (job restart, host eviction)",
    )


def cluster_replica_policy() -> Policy:
    """The built-in policy of replicas across hosts (``eagleeye controller --recovery
    replica``): a dead or hung rank costs only its replica; a GPU beyond use (a critical
    XID, an uncorrectable memory error) evicts its host, whose replicas restart on a spare
    host while the others train on; a non-finite loss is reported."""
    return Policy(
        rules=(*replica_restart_policy().rules, *_HOST_EVICTIONS),
        name="built-in cluster replica (replica restart, host eviction)",
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
