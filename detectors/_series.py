"""Per-subject scalar state for detectors that follow one series (loss, step time)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from collector.types import JOB, Frame
from detectors.stepbatch import StepBatch
from detectors.types import Finding


class RobustWindow:
    """The last ``size`` values, with their median and MAD-based scale."""

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self.values)

    def add(self, value: float) -> None:
        self.values.append(value)

    def stats(self) -> tuple[float, float]:
        arr = np.fromiter(self.values, dtype=float)
        med = float(np.median(arr))
        return med, 1.4826 * float(np.median(np.abs(arr - med)))

    def local(self, recent: int) -> tuple[float, float]:
        """The level of the last ``recent`` values (their median) and the series' noise
        from its step-to-step changes, which a slow trend (a falling loss) does not
        inflate as it inflates the spread of the values themselves."""
        arr = np.fromiter(self.values, dtype=float)
        level = float(np.median(arr[-recent:]))
        if len(arr) < 3:
            return level, 0.0
        diffs = np.diff(arr)
        mad = float(np.median(np.abs(diffs - np.median(diffs))))
        return level, 1.4826 * mad / np.sqrt(2.0)


def job_value(batch: StepBatch, feature: str) -> float | None:
    """The job-wide value of a feature at a step: the median over ranks (robust to one rank)."""
    return batch.job_median(feature)


def job_frame(batch: StepBatch, features: tuple[str, ...]) -> Frame | None:
    """A job-scoped frame holding the job-wide value of each feature present."""
    values = {f: v for f in features if (v := job_value(batch, f)) is not None}
    if not values:
        return None
    return Frame(JOB, batch.step, batch.time, values)


class JobSeries:
    """Base of detectors that read one feature as a job-wide series.

    A subclass sets ``feature`` and implements ``process``; the step-batch form and the
    (empty) time poll come from here.
    """

    feature: str

    def process(self, frame: Frame) -> Sequence[Finding]:
        raise NotImplementedError

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        frame = job_frame(batch, (self.feature,))
        return self.process(frame) if frame is not None else ()

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


def finite(frame: Frame, feature: str) -> float | None:
    value = frame.values.get(feature)
    if value is None or not math.isfinite(value):
        return None
    return float(value)
