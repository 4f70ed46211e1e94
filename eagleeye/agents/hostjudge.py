"""An agent's own judgement of its ranks, on their full series.

The controller sees one summary per host and step: a rank reaches it only when it
stands out against its host by 20 % (``Reduction``), so a 10 % slower rank, a NIC's
collective time or a slow leak never would. The agent holds every rank's series, so it
runs the live detectors that compare a rank with the other ranks of its host or with its
own past (``host_tier_config``: the precise peer comparison while the job is quiet, with
each rank's fixed offset removed; a metric no one reads; a leak's trend) over each step
of its ranks, and sends the controller what they find (a ``findings`` report). The
controller checks each finding (``eagleeye.agents.judging.host_findings``) before its
policy answers it.

A new attempt of the job is a new baseline: the detectors are built afresh, and what
they held of the earlier attempt is dropped (the controller would refuse it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from collector.types import Frame, Subject
from detectors.config import DetectorsConfig
from detectors.pipeline import DetectorPipeline
from detectors.stepbatch import StepBatch
from detectors.types import Finding
from eagleeye.detection import host_tier_config

#: The kind of an agent's report of its judge's findings.
HOST_FINDINGS = "findings"


@dataclass
class HostJudge:
    """Args:
    config: the detectors run on the host's ranks (``host_tier_config``).
    """

    config: DetectorsConfig = field(default_factory=host_tier_config)
    attempt: int = 0
    pipeline: DetectorPipeline = field(init=False)

    def __post_init__(self) -> None:
        self.pipeline = self.config.build()

    def judge(
        self,
        attempt: int,
        step: int,
        subjects: Mapping[int, Subject],
        values: Mapping[int, Mapping[str, float]],
        now: float,
    ) -> list[Finding]:
        """One step of the host's ranks (``{rank: {feature: value}}``); the findings
        released now. A step of an earlier attempt than the last one seen is ignored."""
        if attempt < self.attempt:
            return []
        if attempt > self.attempt:
            self.attempt, self.pipeline = attempt, self.config.build()
        frames = [
            Frame(subjects.get(rank) or Subject(rank=rank), step, now, values[rank])
            for rank in sorted(values)
        ]
        if not frames:
            return []
        batch = StepBatch.from_frames(frames)
        return self.pipeline.process_step(batch)

    def poll(self, now: float) -> list[Finding]:
        """Findings the fusion held long enough without a new step."""
        return self.pipeline.poll(now)

    def flush(self) -> list[Finding]:
        """The end of the series: what the detectors still hold, released."""
        return self.pipeline.flush()


__all__ = ["HOST_FINDINGS", "HostJudge"]
