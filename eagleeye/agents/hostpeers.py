"""The hosts compared with each other, precisely, on the controller.

An agent's judge compares each of its ranks with the host's others
(``eagleeye.agents.hostjudge``): a node whose every rank is 10 % slower does not show
there, and the controller's node frames only name a host 20 % off the others. Each
reduced step carries every host's median of every metric (``HostMedians``), so the
controller runs the live precise peer comparison (``host_peer_config``: each host's own
fixed offset removed, only while the job is quiet) with the hosts as the peers. A host's
finding is on its node: ``slow_rank`` of a host's median is ``slow_node``
(``NODE_KINDS``), other kinds (a NIC's collective time, a data wait) keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from collector.types import Subject
from collector.vocabulary import canonical_name
from detectors.config import DetectorsConfig
from detectors.edge import COUNTERS
from detectors.peer import DEFAULT_FEATURES, NODE_KINDS
from detectors.pipeline import DetectorPipeline
from detectors.stepbatch import StepBatch
from detectors.types import Finding
from eagleeye.agents.intake import HostMedians
from eagleeye.detection import host_peer_config
from ft_runtime.layout import JobLayout

#: Before the detector's name in a finding on a node found against the other hosts.
HOSTS_PREFIX = "hosts:"


@dataclass
class HostPeers:
    """Args:
    layout: the job's layout (each node rank's node and replica).
    config: the comparison run over the hosts' medians (``host_peer_config``).
    """

    layout: JobLayout
    config: DetectorsConfig = field(default_factory=host_peer_config)
    pipeline: DetectorPipeline = field(init=False)

    def __post_init__(self) -> None:
        self.pipeline = self.config.build()

    def judge(self, step: HostMedians) -> list[Finding]:
        """One step of the hosts' medians; the findings on nodes released now."""
        hosts = len(step.nodes)
        # Rows in node-rank order: the hosts come in the order their summaries were
        # opened, which changes from step to step, and the detectors' state is kept per
        # row in the order first seen (a new order costs them a pass over every host).
        order = np.argsort(step.nodes, kind="stable")
        cols = _read(step.names)
        batch = StepBatch(
            step.step,
            step.time,
            step.nodes[order].astype(np.int64),  # a host is a row: its node rank its number
            np.full(hosts, "", dtype=object),
            np.zeros(hosts, dtype=np.int64),
            tuple(step.names[c] for c in cols.tolist()),
            step.medians[np.ix_(cols, order)].T,
        )
        return [
            self._on_node(f)
            for f in self.pipeline.process_step(batch)
            if f.subject.rank is not None
        ]

    def flush(self) -> list[Finding]:
        """The end of the job: what the comparison still holds, on nodes."""
        return [self._on_node(f) for f in self.pipeline.flush() if f.subject.rank is not None]

    def _on_node(self, finding: Finding) -> Finding:
        assert finding.subject.rank is not None
        layout = self.layout
        spec = layout.rank(finding.subject.rank * layout.nproc_per_node)
        whole = layout.replica_size % layout.nproc_per_node == 0  # a node in one replica
        subject = Subject(replica=spec.replica if whole else None, node=spec.node)
        kind = NODE_KINDS.get(finding.kind, finding.kind)
        return replace(
            finding, kind=kind, subject=subject, detector=HOSTS_PREFIX + finding.detector
        )


@lru_cache(maxsize=64)
def _read(names: tuple[str, ...]) -> np.ndarray:
    """The columns of ``names`` the comparison reads (its features, in any spelling, and
    what the edge derives some of them from: the counters whose rates it compares, the
    throttle reasons; the step time its data-wait floor is a share of); a step's other
    metrics (the loss, the sections) would only cost their copy."""
    return np.array([i for i, n in enumerate(names) if canonical_name(n) in _FEATURES], dtype=int)


_FEATURES = (
    frozenset(DEFAULT_FEATURES)
    | {"step_time", "throttle_reasons"}  # a data wait's share; the thermal flag's source
    | {name for name in COUNTERS if f"{name}_rate" in DEFAULT_FEATURES}  # a NIC's errors
)

__all__ = ["HOSTS_PREFIX", "HostPeers"]
