"""Collects per-rank frames of one step so a vectorised detector can see them together."""

from __future__ import annotations

from collector.types import Frame, Subject
from detectors.stepbatch import StepBatch


class StepBuffer:
    """Holds rank frames until the step changes, then hands them over as one StepBatch.

    Frames without a step or without a rank are not peer data and are ignored.
    """

    def __init__(self) -> None:
        self._step: int | None = None
        # Plain tuples, not Frames: Frame's read-only mappings do not pickle, detectors must.
        self._rows: list[tuple[Subject, int, float, dict[str, float]]] = []

    def add(self, frame: Frame) -> StepBatch | None:
        """Adds a frame; returns the previous step's batch when this frame starts a new step."""
        if frame.step is None or frame.subject.rank is None:
            return None
        ready = None
        if self._step is not None and frame.step != self._step:
            ready = self.flush()
        self._step = frame.step
        self._rows.append((frame.subject, frame.step, frame.time, dict(frame.values)))
        return ready

    def flush(self) -> StepBatch | None:
        """The buffered step as a batch (None when empty); the buffer is emptied."""
        if not self._rows:
            return None
        batch = StepBatch.from_frames([Frame(*row) for row in self._rows])
        self._rows = []
        self._step = None
        return batch
