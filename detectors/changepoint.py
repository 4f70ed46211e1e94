"""Change points in throughput: a lasting shift of the step time, not its noise.

A one-sided CUSUM on the step time relative to a robust baseline. Each step adds its
relative excess over the baseline minus a drift of half the minimum shift, clipped so one
slow step (a checkpoint, an evaluation) cannot fire alone; the sum crossing ``h`` is a
change point. After firing, the baseline is re-learnt at the new level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from collector.types import Frame, Subject
from collector.vocabulary import canonical_name
from detectors._series import JobSeries, RobustWindow, finite
from detectors.types import Finding, Severity


@dataclass
class _State:
    window: RobustWindow
    cusum: float = 0.0
    run: int = 0


class ThroughputChange(JobSeries):
    """Fires ``throughput_drop`` when the step time shifts up by ``min_shift`` or more.

    Args:
        feature: the series (``step_time`` by default; higher is worse).
        min_shift: the smallest relative shift worth a finding (0.1 = 10 %).
        h: CUSUM decision level, in relative-shift units.
        window: steps of baseline.
        warmup: steps before the first decision.

    >>> from collector.types import Frame, JOB
    >>> det = ThroughputChange(warmup=10)
    >>> found = []
    >>> for s in range(60):
    ...     t = 1.0 + 0.01 * (s % 2) + (0.3 if s >= 40 else 0.0)
    ...     found += det.process(Frame(JOB, s, float(s), {"step_time": t}))
    >>> [(f.kind, f.step) for f in found]
    [('throughput_drop', 42)]
    """

    name = "throughput_change"

    def __init__(
        self,
        feature: str = "step_time",
        min_shift: float = 0.1,
        h: float = 0.4,
        window: int = 64,
        warmup: int = 16,
    ) -> None:
        self.feature, self.min_shift, self.h = canonical_name(feature), min_shift, h
        self.window, self.warmup = window, warmup
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
        step = min(excess, 2.0 * self.min_shift) - self.min_shift / 2.0
        return max(0.0, state.cusum + step)

    def process(self, frame: Frame) -> Sequence[Finding]:
        value = finite(frame, self.feature)
        if value is None:
            return ()
        state = self._state(frame.subject)
        if len(state.window) < self.warmup:
            state.window.add(value)
            return ()
        state.cusum = self._next(state, value)
        state.run = state.run + 1 if state.cusum > 0 else 0
        if state.cusum <= self.h:
            if state.cusum == 0.0:
                state.window.add(value)  # learn only clearly normal values
            return ()
        base, _ = state.window.stats()
        self._states[frame.subject] = _State(RobustWindow(self.window))
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
            state = self._states[subject] = _State(RobustWindow(self.window))
        return state
