"""Collects per-rank frames of one step so a vectorised detector can see them together."""

from __future__ import annotations

from collections.abc import Sequence

from collector.types import Frame, Subject
from detectors.stepbatch import StepBatch
from detectors.types import Finding

_Row = tuple[Subject, int, float, dict[str, float]]


class StepBuffer:
    """Holds rank frames per step and hands a step over as one StepBatch when it is complete.

    Ranks report a step at slightly different times, so frames of neighbouring steps
    interleave. A step is complete when as many ranks reported it as in the largest step
    handed over so far, or when a frame ``lag`` steps later arrives (the first step, and a
    rank that stays silent, must not hold the others).
    Frames without a step or without a rank are not peer data and are ignored.
    """

    def __init__(self, lag: int = 2) -> None:
        self.lag = lag
        # Plain tuples, not Frames: Frame's read-only mappings do not pickle, detectors must.
        self._steps: dict[int, dict[int, _Row]] = {}
        self._expected = 0  # ranks in the largest step handed over so far

    def add(self, frame: Frame) -> list[StepBatch]:
        """Adds a frame; returns the batches of the steps it completes, oldest first."""
        rank, step = frame.subject.rank, frame.step
        if step is None or rank is None:
            return []
        rows = self._steps.setdefault(step, {})
        rows[rank] = (frame.subject, step, frame.time, dict(frame.values))
        full = 0 < self._expected <= len(rows)
        # Steps leave in order: a complete step takes the older, straggling ones with it.
        newest = step if full else step - self.lag
        done = [s for s in self._steps if s <= newest]
        return [self._pop(s) for s in sorted(done)]

    def flush(self) -> list[StepBatch]:
        """Every buffered step as a batch, oldest first; the buffer is emptied."""
        return [self._pop(s) for s in sorted(self._steps)]

    def _pop(self, step: int) -> StepBatch:
        rows = self._steps.pop(step)
        self._expected = max(self._expected, len(rows))
        return StepBatch.from_frames([Frame(*row) for row in rows.values()])


class Stepwise:
    """The per-frame protocol of a detector that works on whole steps (``process_step``):
    frames are gathered by a StepBuffer and compared a step at a time."""

    _stepwise_buffer: StepBuffer | None = None

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        raise NotImplementedError

    def process(self, frame: Frame) -> Sequence[Finding]:
        if self._stepwise_buffer is None:
            self._stepwise_buffer = StepBuffer()
        return [f for b in self._stepwise_buffer.add(frame) for f in self.process_step(b)]

    def poll(self, now: float) -> Sequence[Finding]:
        return ()

    def flush(self) -> Sequence[Finding]:
        """Evaluates the step still buffered (at the end of a stream)."""
        if self._stepwise_buffer is None:
            return []
        return [f for b in self._stepwise_buffer.flush() for f in self.process_step(b)]
