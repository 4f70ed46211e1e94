"""Fusion: many raw findings about one fault become one explained finding.

Rules, in order:
  * hold: a WARN finding waits ``hold_steps`` before release, so the findings a fault
    raises on one subject over a few steps (a hot GPU's clock, temperature and compute
    time) merge into one; CRITICAL findings go out at once.
  * merge: findings on the same subject (or a rank inside a held node finding) merge; the
    kind of highest precedence names the root cause, evidence is the union.
  * dedup and hysteresis: an incident stays open while findings keep coming and closes after
    ``clear_steps`` quiet steps; findings on an open incident are absorbed, except one that
    escalates a released incident (critical after a warning) or names its cause
    (``EXPLAINED_BY``: thermal after a slow rank), which is released as well.
  * symptoms: a job-wide ``throughput_drop`` whose shift began near a specific incident is
    that incident's effect, not a second fault, and is absorbed, as is one that comes while
    a fail-slow (WARN) incident opened in the last ``ongoing_window`` steps may still be on
    (they last minutes to tens of minutes); an unexplained one is held ``symptom_window``
    steps for its explanation before it is released.
  * generic findings (``metric_outlier``, ``multivariate``) are held ``symptom_window``
    steps, so a specific finding on their subject names the fault and absorbs them; one
    on a subject whose fail-slow (WARN) incident opened in the last ``ongoing_window``
    steps is that fault's effect and is absorbed too.
  * causes: a gradient-norm spike that comes with a loss spike or a NaN (on any subject,
    within ``hold_steps``) is their effect through the all-reduce and merges into them.
  * fan-in: a job-wide kind (loss spike, divergence, ...) released on several ranks at
    once becomes one job finding, which absorbs the same kind from later ranks.
  * flap suppression: a subject that opened ``flap_max`` incidents within ``flap_window``
    steps is muted until it stays quiet for a whole window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from collector.types import Subject
from detectors.types import Finding, Severity

#: Root-cause precedence: earlier kinds explain later ones on the same subject.
PRECEDENCE: tuple[str, ...] = (
    "xid",
    "ecc",
    "process_exit",
    "nan",
    "collective_timeout",
    "hang",
    "thermal",
    "nic_degradation",
    "memory_leak",
    "dataloader_stall",
    "slow_replica",
    "slow_node",
    "slow_rank",
    "loss_spike",
    "grad_spike",
    "divergence",
    "multivariate",
    "metric_outlier",
    "throughput_drop",
)
SYMPTOMS = frozenset({"throughput_drop"})
#: Findings that say something is off without saying what: held as long as symptoms, so
#: a specific finding on the same subject (a data-loader stall behind a GPU's idle
#: utilisation) names the fault and absorbs them.
GENERIC = frozenset({"metric_outlier", "multivariate"})
#: Kinds that another kind causes on other subjects too: a rank's NaN or loss spike goes
#: through the all-reduce into every rank's gradient norm.
CAUSES = {"grad_spike": frozenset({"loss_spike", "nan"})}
#: A rank-level kind that another on the same rank explains: a GPU throttled by heat
#: computes slower, and that is the thermal finding's, not a second fault. Found first,
#: the cause is the peer comparison's reason not to report the effect; found after the
#: effect was released (a GPU polled less often than steps are timed), it is released
#: too, so the fault is named by its cause.
EXPLAINED_BY: Mapping[str, frozenset[str]] = MappingProxyType({"slow_rank": frozenset({"thermal"})})
#: Kinds about the whole job: seen on several ranks at once, they are one job finding.
JOB_WIDE = frozenset({"loss_spike", "grad_spike", "divergence", "throughput_drop", "multivariate"})
_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARN: 1, Severity.CRITICAL: 2}


def _precedence(kind: str) -> int:
    return PRECEDENCE.index(kind) if kind in PRECEDENCE else len(PRECEDENCE)


def merge(a: Finding, b: Finding) -> Finding:
    """One finding explaining both: the root-cause kind and subject win, evidence unites.

    It dates from the earliest of its parts (a hot GPU's clock before its temperature),
    but a symptom or a generic finding taken in by a specific one does not date it: a job
    slowed by congestion before a rank became slow does not make the slow rank's fault
    begin then.
    """
    first, second = (a, b) if _precedence(a.kind) <= _precedence(b.kind) else (b, a)
    evidence = {**second.evidence, **first.evidence}
    evidence["merged_findings"] = a.evidence.get("merged_findings", 1.0) + b.evidence.get(
        "merged_findings", 1.0
    )
    severity = max(a.severity, b.severity, key=_SEVERITY_RANK.__getitem__)
    vague = SYMPTOMS | GENERIC
    if second.kind in vague and first.kind not in vague:
        time, step = first.time, first.step
    else:
        time, step = min(a.time, b.time), _min_step(a.step, b.step)
    return replace(
        first,
        score=max(a.score, b.score),
        severity=severity,
        time=time,
        step=step,
        evidence=evidence,
    )


def _min_step(a: int | None, b: int | None) -> int | None:
    steps = [s for s in (a, b) if s is not None]
    return min(steps) if steps else None


def covers(outer: Subject, inner: Subject) -> bool:
    """Whether a finding on ``outer`` explains one on ``inner`` (same subject or inside it)."""
    if outer == inner:
        return True
    if outer.scope == "job":
        return False
    if outer.scope == "node":
        return inner.node == outer.node
    if outer.scope == "replica":
        return inner.replica == outer.replica
    return outer.rank == inner.rank and inner.scope == "rank"


@dataclass
class Incident:
    """An open fault: the finding that represents it and when it was last seen."""

    finding: Finding
    last_step: float
    released: bool
    opened_at: float


@dataclass
class FusionPolicy:
    """Fusion parameters. Steps are training steps; frames without a step use seconds."""

    hold_steps: int = 2
    clear_steps: int = 20
    symptom_window: int = 20
    ongoing_window: int = 150
    flap_max: int = 3
    flap_window: int = 200
    extra: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hold_steps < 0 or self.clear_steps < 1 or self.flap_max < 1:
            raise ValueError(
                "fusion needs hold_steps >= 0, clear_steps >= 1 and flap_max >= 1, got "
                f"{self.hold_steps}, {self.clear_steps}, {self.flap_max}"
            )


def when(finding: Finding) -> float:
    """The finding's position on the fusion clock: its step, else its time."""
    return float(finding.step) if finding.step is not None else finding.time


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """Findings ordered by time, root causes first among equals."""
    return sorted(findings, key=lambda f: (when(f), _precedence(f.kind)))
