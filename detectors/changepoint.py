"""Change points in throughput: a lasting shift of the step time, not its noise.

A one-sided CUSUM on the step time relative to a robust baseline. Each step adds the
relative excess of the median of the last ``smooth`` step times over the baseline, less
a drift of half the minimum shift, clipped so one slow step (a checkpoint, an evaluation)
cannot fire alone; the sum crossing ``h`` is a change point. The median matters in
synchronous training: a step lasts as long as its slowest rank, so one rank's hiccup,
frequent among thousands, is every step's. After firing, the baseline is re-learnt at the
new level.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collector.types import Frame, Subject
from collector.vocabulary import canonical_name
from detectors._series import JobSeries, RobustWindow, finite
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity


@dataclass
class _State:
    window: RobustWindow
    recent: deque[float]
    cusum: float = 0.0
    run: int = 0


class ThroughputChange(JobSeries):
    """Fires ``throughput_drop`` when the step time shifts up by ``min_shift`` or more.

    Args:
        feature: the series (``step_time`` by default; higher is worse).
        min_shift: the smallest relative shift worth a finding (0.1 = 10 %).
        h: CUSUM decision level, in relative-shift units.
        window: steps of baseline.
        warmup: steps before the first decision, after the start and after every
            (re)launch of the job (its first steps are slow for reasons of their own).
        min_abs_shift: the smallest absolute shift (the feature's unit, seconds for step
            time) worth a finding: a step time going from 3 to 6 ms doubles and matters
            to no one.
        smooth: step times whose median is compared with the baseline.

    >>> from collector.types import Frame, JOB
    >>> det = ThroughputChange(warmup=10)
    >>> found = []
    >>> for s in range(60):
    ...     t = 1.0 + 0.01 * (s % 2) + (0.3 if s >= 40 else 0.0)
    ...     found += det.process(Frame(JOB, s, float(s), {"step_time": t}))
    >>> [(f.kind, f.step) for f in found]
    [('throughput_drop', 44)]
    """

    name = "throughput_change"

    def __init__(
        self,
        feature: str = "step_time",
        min_shift: float = 0.1,
        h: float = 0.4,
        window: int = 64,
        warmup: int = 16,
        min_abs_shift: float = 0.02,
        smooth: int = 5,
    ) -> None:
        self.feature, self.min_shift, self.h = canonical_name(feature), min_shift, h
        self.window, self.warmup, self.min_abs_shift = window, warmup, min_abs_shift
        self.smooth = smooth
        self._states: dict[Subject, _State] = {}

    def score_one(self, frame: Frame) -> float:
        """The CUSUM statistic after this value, relative to ``h`` (0 during warm-up)."""
        state = self._states.get(frame.subject)
        value = finite(frame, self.feature)
        if state is None or value is None or len(state.window) < self.warmup:
            return 0.0
        return self._next(state, value) / self.h

    def learn_one(self, frame: Frame) -> None:
        value = finite(frame, self.feature)
        if value is not None:
            self._state(frame.subject).window.add(value)

    def _next(self, state: _State, value: float) -> float:
        base, _ = state.window.stats()
        excess = (value - base) / base if base > 0 else 0.0
        if value - base < self.min_abs_shift:
            excess = min(excess, 0.0)
        step = min(excess, 2.0 * self.min_shift) - self.min_shift / 2.0
        return max(0.0, state.cusum + step)

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        since = batch.column("since_launch")
        if np.isfinite(since).any() and np.nanmedian(since) < self.warmup:
            self._states.clear()  # the job (re)started: its baseline starts again
            return ()
        return super().process_step(batch)

    def process(self, frame: Frame) -> Sequence[Finding]:
        if "launched" in frame.values:
            self._states.clear()
        value = finite(frame, self.feature)
        if value is None:
            return ()
        state = self._state(frame.subject)
        state.recent.append(value)
        if len(state.window) < self.warmup:
            state.window.add(value)
            return ()
        raw, value = value, float(np.median(state.recent))
        state.cusum = self._next(state, value)
        state.run = state.run + 1 if state.cusum > 0 else 0
        if state.cusum <= self.h:
            if state.cusum == 0.0:
                state.window.add(raw)  # learn only clearly normal values
            return ()
        base, _ = state.window.stats()
        self._states[frame.subject] = self._fresh()
        evidence = {
            self.feature: value,
            f"{self.feature}_baseline": base,
            "relative_shift": value / base - 1.0,
            "cusum": state.cusum,
            "steps_shifted": float(state.run),
        }
        return (
            Finding(
                "throughput_drop",
                frame.subject,
                state.cusum / self.h,
                Severity.WARN,
                frame.time,
                frame.step,
                evidence,
                self.name,
            ),
        )

    def _state(self, subject: Subject) -> _State:
        state = self._states.get(subject)
        if state is None:
            state = self._states[subject] = self._fresh()
        return state

    def _fresh(self) -> _State:
        return _State(RobustWindow(self.window), deque(maxlen=self.smooth))
