"""The ranks' telemetry reduced on the hosts, judged on the controller: what both
coordinators (``--recovery job`` and ``--recovery replica``) do with the frames of the
summary intake (``eagleeye.agents.intake``). The frames are stored (the outlier rows, the
job's and the outstanding hosts' frames) and read by ``reduced_detectors`` (a non-finite
loss, a rank slower than its host's others, the job's step time falling off); the
findings are returned for the coordinator to answer through its policy.

The agents judge their own ranks' full series too (``eagleeye.agents.hostjudge``) and
report what they find; ``host_findings`` checks each such finding before anything acts on
it: a kind the host's detectors can find, a warning (never critical), a rank of the
sender's own node, finite numbers, the current attempt. One fault crossing both the
controller's bar and a host's (a 60 % slower rank) is one finding (``ReducedJudge.once``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from collector.types import Frame, Sample, Subject
from detectors.base import Detector
from detectors.fusion import GENERIC, SYMPTOMS, FusionPolicy
from detectors.types import Finding, Severity
from eagleeye.agents.hostpeers import HostPeers
from eagleeye.agents.intake import HostMedians
from eagleeye.agents.membership import AgentState
from eagleeye.detection import HOST_TIER_KINDS, reduced_detectors
from eagleeye.store import RunStore
from ft_runtime.layout import JobLayout

log = logging.getLogger(__name__)

#: The most findings one report may carry, and evidence entries one finding.
MAX_HOST_FINDINGS = 1000
MAX_EVIDENCE = 64
#: Steps after a finding in which another detector's of its kind and subject is the same
#: fault (the fusion's ``ongoing_window``).
ONGOING_STEPS = FusionPolicy().ongoing_window


@dataclass
class ReducedJudge:
    """Args:
    store: the run store the frames' samples go to (None: kept nowhere, as in a replay).
    layout: the job's layout; with it the hosts' medians are compared with each other.
    """

    store: RunStore | None
    layout: JobLayout | None = None
    detectors: list[Detector] = field(default_factory=reduced_detectors)
    suppressed: int = 0  # findings of a fault another detector had found
    hosts: HostPeers | None = field(init=False, default=None)
    _answered: dict[tuple[str, Subject], tuple[str, int]] = field(default_factory=dict)
    _on: dict[tuple[str, object], int] = field(default_factory=dict)  # -> its latest step
    _fault: float = -math.inf  # the step of the latest finding of a fault (not a symptom)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Fresh detectors: a new attempt's baseline."""
        self.detectors = reduced_detectors()
        self.hosts = None if self.layout is None else HostPeers(self.layout)
        self._answered.clear()
        self._on.clear()
        self._fault = -math.inf

    def judge(
        self, frames: list[Frame], now: float, medians: Sequence[HostMedians] = ()
    ) -> list[Finding]:
        """The frames stored and judged, and the hosts' medians of each step compared
        with each other (``HostPeers``, with a ``layout``); returns the findings (not yet
        answered)."""
        if self.store is not None:
            self.store.add_samples(s for frame in frames for s in frame_samples(frame))
        found: list[Finding] = []
        for frame in frames:
            for detector in self.detectors:
                found += detector.process(frame)
        for detector in self.detectors:
            found += detector.poll(now)
        if self.hosts is not None:
            for step in medians:
                found += self.hosts.judge(step)
        return self.once(found)

    def once(self, found: list[Finding]) -> list[Finding]:
        """``found`` less the warnings of a kind and subject another detector (the
        controller's or a host's) found within ``ONGOING_STEPS`` steps before (two bars
        crossed at different steps of one fault; the same detector firing again has
        re-armed by its own hysteresis: a new fault), less a metric no one reads
        standing out on a subject with a fault still on (a hung rank's power falls), and
        less the job's throughput falling off while any fault may still be on (a slow
        rank slows the job: the fusion's symptom rule)."""
        out = []
        for finding in found:
            if finding.severity is Severity.WARN and self._known(finding):
                self.suppressed += 1
                continue
            self.note(finding)
            out.append(finding)
        return out

    def note(self, finding: Finding) -> None:
        """A finding answered (of this judge's or from elsewhere: an exit, a hang, the
        host rules): its fault may be on for ``ONGOING_STEPS`` steps."""
        if finding.step is None:
            return
        if len(self._answered) >= 65536:
            self._answered.clear()
            self._on.clear()
        self._answered[(finding.kind, finding.subject)] = (finding.detector, finding.step)
        self._on[_where(finding.subject)] = finding.step
        if finding.kind not in SYMPTOMS and finding.kind not in GENERIC:
            self._fault = finding.step

    def _known(self, finding: Finding) -> bool:
        step = finding.step
        if step is None:
            return False
        if finding.kind in GENERIC:
            since = self._on.get(_where(finding.subject))
            if since is not None and 0 <= step - since <= ONGOING_STEPS:
                return True
        if finding.kind in SYMPTOMS and 0 <= step - self._fault <= ONGOING_STEPS:
            return True
        last = self._answered.get((finding.kind, finding.subject))
        return (
            last is not None
            and last[0] != finding.detector
            and 0 <= step - last[1] <= ONGOING_STEPS
        )


def _where(subject: Subject) -> tuple[str, object]:
    """A subject by its most specific place (a rank by its number alone: a finding of the
    hosts' rules and one of the summaries' place it alike)."""
    if subject.rank is not None:
        return ("rank", subject.rank)
    return (subject.scope, str(subject))


def host_findings(
    body: Mapping[str, Any], agent: str, node_rank: int, layout: JobLayout, now: float
) -> tuple[int, list[Finding]]:
    """The attempt and the sound findings of an agent's ``findings`` report (the agent of
    ``node_rank``), each on its rank's place in ``layout``, at ``now``, named
    ``host:<detector>``; each unsound one is logged and dropped, never acted on."""
    attempt, rows = body.get("attempt"), body.get("findings")
    if not isinstance(attempt, int) or attempt < 0 or not isinstance(rows, list):
        log.warning("dropped the findings of %s: no attempt or no list of findings", agent)
        return -1, []
    if len(rows) > MAX_HOST_FINDINGS:
        log.warning("dropped the findings of %s: %d, over %d", agent, len(rows), MAX_HOST_FINDINGS)
        return -1, []
    out = []
    for row in rows:
        try:
            finding = Finding.from_json(row)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("dropped a finding of %s that does not parse: %s", agent, exc)
            continue
        why = _unsound(finding, node_rank, layout)
        if why:
            log.warning("dropped a finding of %s: %s", agent, why)
            continue
        assert finding.subject.rank is not None
        spec = layout.rank(finding.subject.rank)
        subject = Subject(replica=spec.replica, rank=spec.rank, node=spec.node)
        out.append(replace(finding, subject=subject, time=now, detector=f"host:{finding.detector}"))
    return attempt, out


def node_rank_of(agent: str, by_node: Mapping[int, AgentState]) -> int | None:
    """The node rank ``agent`` holds in the job; None when it holds none (a spare)."""
    return next((n for n, a in by_node.items() if a.agent == agent), None)


def _unsound(finding: Finding, node_rank: int, layout: JobLayout) -> str:
    """Why a host's finding must not be acted on; empty when it is sound."""
    rank = finding.subject.rank
    if finding.kind not in HOST_TIER_KINDS:
        return f"kind {finding.kind!r} is none the host's detectors find"
    if finding.severity is not Severity.WARN:
        return f"severity {finding.severity.value}: the host's detectors only warn"
    if rank is None or not 0 <= rank < layout.world_size:
        return f"it names no rank of the job ({finding.subject})"
    if rank // layout.nproc_per_node != node_rank:
        return f"rank {rank} is not on node rank {node_rank}"
    if finding.step is None or finding.step < 0:
        return f"step {finding.step}: a host's finding is of a step"
    if not math.isfinite(finding.score) or len(finding.evidence) > MAX_EVIDENCE:
        return f"score {finding.score}, {len(finding.evidence)} evidence entries"
    if len(finding.detector) > 128 or any(len(k) > 128 for k in finding.evidence):
        return "a detector or evidence name over 128 characters"
    return ""


def job_frames(frames: list[Frame]) -> list[Frame]:
    """The job's frame of each step among ``frames`` (the exporter's steps)."""
    return [f for f in frames if f.subject.scope == "job" and f.step is not None]


def frame_samples(frame: Frame) -> list[Sample]:
    """A frame of reduced telemetry as the store's samples (its attempt as a label)."""
    values = dict(frame.values)
    attempt = values.pop("attempt", None)
    subject = frame.subject
    labels = {
        k: str(v)
        for k, v in (("rank", subject.rank), ("replica", subject.replica), ("node", subject.node))
        if v is not None
    }
    if attempt is not None:
        labels["attempt"] = str(int(attempt))
    return [
        Sample(name, value, frame.time, labels, frame.step)
        for name, value in values.items()
        if not name.endswith(".host_median")  # the host's, stored once in its summary
    ]


__all__ = ["ReducedJudge", "frame_samples", "host_findings", "job_frames", "node_rank_of"]
