"""Extension points of the detectors.

Two shapes of detector exist. ``Detector`` is what the pipeline runs: frames in, findings
out, plus a time tick for detectors that fire on silence (a rank that stopped stepping).
``StreamingDetector`` is a scorer in river's style (``learn_one``/``score_one``); a gate
turns its scores into findings so the pipeline only ever sees ``Detector``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from collector.types import Frame
from detectors.types import Finding


@runtime_checkable
class Detector(Protocol):
    """Frames in, findings out. Never raises for odd input; returns no finding instead."""

    name: str

    def process(self, frame: Frame) -> Sequence[Finding]:
        """Updates state with one frame and returns what it shows to be wrong."""
        ...

    def poll(self, now: float) -> Sequence[Finding]:
        """Called periodically with the current time: findings about silence."""
        ...


@runtime_checkable
class StreamingDetector(Protocol):
    """A scorer: higher score means more anomalous; 0.0 during warm-up."""

    def learn_one(self, frame: Frame) -> None: ...

    def score_one(self, frame: Frame) -> float: ...
