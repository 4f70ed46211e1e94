"""The ranks' telemetry reduced on the hosts, judged on the controller: what both
coordinators (``--recovery job`` and ``--recovery replica``) do with the frames of the
summary intake (``eagleeye.agents.intake``). The frames are stored (the outlier rows, the
job's and the outstanding hosts' frames) and read by ``reduced_detectors`` (a non-finite
loss, a rank slower than its host's others, the job's step time falling off); the
findings are returned for the coordinator to answer through its policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from collector.types import Frame, Sample
from detectors.base import Detector
from detectors.types import Finding
from eagleeye.detection import reduced_detectors
from eagleeye.store import RunStore


@dataclass
class ReducedJudge:
    """Args:
    store: the run store the frames' samples go to.
    """

    store: RunStore
    detectors: list[Detector] = field(default_factory=reduced_detectors)

    def reset(self) -> None:
        """Fresh detectors: a new attempt's baseline."""
        self.detectors = reduced_detectors()

    def judge(self, frames: list[Frame], now: float) -> list[Finding]:
        """The frames stored and judged; returns the findings (not yet answered)."""
        self.store.add_samples(s for frame in frames for s in frame_samples(frame))
        found: list[Finding] = []
        for frame in frames:
            for detector in self.detectors:
                found += detector.process(frame)
        for detector in self.detectors:
            found += detector.poll(now)
        return found


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


__all__ = ["ReducedJudge", "frame_samples", "job_frames"]
