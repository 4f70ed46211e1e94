"""What the job and the replica coordinators across hosts share about a host's hardware.

An agent forwards its host's samples (``report_samples``); the host rules read them
(``HostRules``: an XID, an uncorrectable memory error, a thermal throttle is a finding on
the rank using the GPU, or on its node). The policy's answer to a GPU beyond use is an
``evict`` of the node (``node:nodeN``, ``held_node``): its host is fenced for good and a
spare takes its node rank (``Spares.take_over``). An evicted host (suspected hardware)
stays out: its agent ends, and a spare on that host is refused (``spare_refusal``) unless
its hello says ``readmit`` (``eagleeye agent --spare --readmit``, once its hardware is
checked). A finding from outside (Alertmanager's webhook) naming a host no agent of the
job runs on is recorded and nothing acts on it (``off_the_job``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from collector.types import Sample
from detectors.base import Detector
from detectors.types import Finding
from eagleeye.agents.membership import AgentReport, AgentState
from eagleeye.detection import host_detectors
from eagleeye.hostsources import host_frames
from ft_runtime.layout import JobLayout

log = logging.getLogger(__name__)


def report_samples(report: AgentReport) -> list[Sample] | None:
    """The samples an agent's report carries; None (logged) when they do not parse."""
    try:
        return [Sample.from_json(row) for row in report.body.get("samples", [])]
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("dropped the %s of %s: %s", report.kind, report.agent, exc)
        return None


@dataclass
class HostRules:
    """The host rules over the samples the agents forward."""

    detectors: list[Detector] = field(default_factory=host_detectors)

    def findings(self, samples: list[Sample]) -> list[Finding]:
        found: list[Finding] = []
        for frame in host_frames(samples):
            for detector in self.detectors:
                found += detector.process(frame)
        return found


def held_node(target: str, by_node: Mapping[int, AgentState]) -> tuple[int, AgentState] | None:
    """The node rank and its agent an action's target (``node:nodeN``) names; None when
    it names no node of the job."""
    if not target.startswith("node:"):
        return None
    node = target.removeprefix("node:")
    return next(((n, a) for n, a in by_node.items() if f"node{n}" == node), None)


def eviction_cause(agent: AgentState, node: int, reason: str) -> str:
    """Why a node's host was evicted, as its fencing, its agent and the record say."""
    return f"host {agent.host} (node{node}) evicted: {reason}"


def readmit_refusal(host: str, why: str) -> str:
    """What a spare on a host evicted from the job is told when it did not ask to be
    readmitted."""
    return (
        f"host {host} was evicted from this job ({why}); once its hardware is checked, "
        "readmit it as a spare with eagleeye agent --spare --readmit"
    )


def spare_refusal(agent: AgentState, evicted: Mapping[str, str]) -> str | None:
    """Why a spare is refused (None: admitted): a fenced host's agent joining again
    (``rejoined_from``) before its ranks ended, or a spare on a host evicted from the job
    (``evicted``: host -> why) that was not started with ``--readmit``."""
    rejoined = agent.info.get("rejoined_from")
    if rejoined is not None and agent.info.get("ranks_ended") is not True:
        return f"{rejoined} joins again as a spare before its ranks ended"
    why = evicted.get(agent.host)
    if why is not None and agent.info.get("readmit") is not True:
        return readmit_refusal(agent.host, why)
    return None


def spare_detail(agent: AgentState, evicted: Mapping[str, str]) -> dict[str, object]:
    """What the event of an admitted spare records: the fenced agent it joins again as,
    and the cause of its host's eviction when the operator readmitted it."""
    rejoined = agent.info.get("rejoined_from")
    detail: dict[str, object] = {}
    if rejoined is not None:
        detail = {"rejoined_from": str(rejoined), "ranks_ended": True}
    if agent.host in evicted:
        detail["readmitted"] = evicted[agent.host]  # the operator's choice, with the cause
    return detail


def off_the_job(finding: Finding, layout: JobLayout) -> bool:
    """Whether a finding from outside names a host the job does not run on (not placed
    on a rank or node of the job): logged; the caller records it, and nothing acts on it."""
    subject = finding.subject
    nodes = {spec.node for spec in layout.ranks()}
    if subject.node is None or subject.node in nodes or subject.rank is not None:
        return False
    log.warning("%s on %s: no agent of the job there; recorded", finding.kind, subject.node)
    return True


__all__ = [
    "HostRules",
    "eviction_cause",
    "held_node",
    "off_the_job",
    "readmit_refusal",
    "report_samples",
    "spare_detail",
    "spare_refusal",
]
