"""Training numerics: loss and gradient-norm spikes against their recent history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from collector.types import JOB, Frame, Subject
from collector.vocabulary import canonical_name
from detectors._series import JobSeries, RobustWindow, finite
from detectors.errors import DetectorError
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity


@dataclass
class _State:
    window: RobustWindow
    above: int = 0
    below: int = 0
    fired: bool = False


class SeriesSpike(JobSeries):
    """Fires when a series jumps above its recent level: loss spikes, grad-norm spikes.

    A value is a spike when it exceeds the level of the last ``recent`` values (their
    median) by ``z`` times the series' noise *and* by ``min_ratio`` times that level (so a
    flat, noiseless series does not fire on rounding). The noise is measured on the
    step-to-step changes over the last ``window`` values, so a loss that falls fast early
    in training does not hide a spike behind its own trend. Spikes are not learned (the
    baseline stays clean); after firing, the detector re-arms once ``clear`` consecutive
    values are normal again.
    In step mode it watches the job-wide value: the median over ranks, or with
    ``reduce="max"`` the highest rank's value, so a spike on one rank (its bad batch) is
    seen too and the finding names that rank.

    >>> det = SeriesSpike("loss", "loss_spike", warmup=5)
    >>> from collector.types import Frame, JOB
    >>> out = [det.process(Frame(JOB, s, float(s), {"loss": 2.0 + 0.01 * (s % 3)}))
    ...        for s in range(20)]
    >>> [f.kind for f in det.process(Frame(JOB, 20, 20.0, {"loss": 6.0}))]
    ['loss_spike']
    """

    def __init__(
        self,
        feature: str = "loss",
        kind: str = "loss_spike",
        z: float = 8.0,
        min_ratio: float = 0.25,
        window: int = 64,
        warmup: int = 10,
        clear: int = 5,
        reduce: str = "median",
        recent: int = 5,
    ) -> None:
        if reduce not in ("median", "max"):
            raise DetectorError(f"reduce must be 'median' or 'max', got {reduce!r}")
        self.reduce = reduce
        self.feature, self.kind = canonical_name(feature), kind
        self.name = kind
        self.z, self.min_ratio = z, min_ratio
        self.window, self.warmup, self.clear = window, warmup, clear
        self.recent = recent
        self._states: dict[Subject, _State] = {}

    def score_one(self, frame: Frame) -> float:
        """How many robust deviations above the baseline the value is (0 in warm-up)."""
        state = self._states.get(frame.subject)
        value = finite(frame, self.feature)
        if state is None or value is None or len(state.window) < self.warmup:
            return 0.0
        level, noise = state.window.local(self.recent)
        floor = max(noise, self.min_ratio * abs(level) / self.z, 1e-12)
        return max(0.0, (value - level) / floor)

    def learn_one(self, frame: Frame) -> None:
        value = finite(frame, self.feature)
        if value is not None:
            self._state(frame.subject).window.add(value)

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        if self.reduce == "median":
            return super().process_step(batch)
        column = batch.column(self.feature)
        finite_rows = np.isfinite(column)
        if not finite_rows.any():
            return ()
        row = int(np.argmax(np.where(finite_rows, column, -np.inf)))
        found = self.process(Frame(JOB, batch.step, batch.time, {self.feature: float(column[row])}))
        return [replace(f, subject=batch.subject(row)) for f in found]

    def process(self, frame: Frame) -> Sequence[Finding]:
        value = finite(frame, self.feature)
        if value is None:
            return ()
        state = self._state(frame.subject)
        score = self.score_one(frame)
        if score <= self.z:
            state.window.add(value)
            state.below += 1
            state.fired = state.fired and state.below < self.clear
            return ()
        state.below = 0
        if state.fired:
            return ()
        state.fired = True
        med, _ = state.window.local(self.recent)
        evidence = {
            self.feature: value,
            f"{self.feature}_baseline": med,
            "ratio": value / med if med else 0.0,
            "robust_z": score,
        }
        return (
            Finding(
                self.kind,
                frame.subject,
                score,
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


def loss_spike(**params: float) -> SeriesSpike:
    """A SeriesSpike on ``loss`` (kind ``loss_spike``)."""
    return SeriesSpike("loss", "loss_spike", **params)  # type: ignore[arg-type]


def grad_norm_spike(**params: float) -> SeriesSpike:
    """A SeriesSpike on ``grad_norm`` (kind ``grad_spike``)."""
    return SeriesSpike("grad_norm", "grad_spike", **params)  # type: ignore[arg-type]


class Divergence(JobSeries):
    """Fires ``divergence`` when the smoothed loss climbs well above its best and stays there.

    An EMA of the loss (``alpha``) is compared with the lowest EMA seen; ``persistence``
    consecutive steps above ``(1 + rise)`` times that minimum are a divergence, a slower and
    more lasting failure than a spike. In step mode it watches the job-wide loss.

    >>> from collector.types import Frame, JOB
    >>> det = Divergence(persistence=5)
    >>> losses = [3.0 - 0.01 * s for s in range(100)] + [2.0 + 0.05 * s for s in range(60)]
    >>> [(f.kind, f.step) for s, v in enumerate(losses)
    ...  for f in det.process(Frame(JOB, s, float(s), {"loss": v}))]
    [('divergence', 135)]
    """

    name = "divergence"

    def __init__(
        self,
        feature: str = "loss",
        alpha: float = 0.05,
        rise: float = 0.3,
        persistence: int = 20,
        warmup: int = 50,
    ) -> None:
        self.feature, self.alpha, self.rise = canonical_name(feature), alpha, rise
        self.persistence, self.warmup = persistence, warmup
        self._ema: dict[Subject, float] = {}
        self._best: dict[Subject, float] = {}
        self._seen: dict[Subject, int] = {}
        self._above: dict[Subject, int] = {}

    def process(self, frame: Frame) -> Sequence[Finding]:
        value = finite(frame, self.feature)
        if value is None:
            return ()
        key = frame.subject
        ema = self._ema.get(key, value)
        ema = self._ema[key] = ema + self.alpha * (value - ema)
        seen = self._seen[key] = self._seen.get(key, 0) + 1
        if seen < self.warmup:
            self._best[key] = min(self._best.get(key, ema), ema)
            return ()
        best = self._best[key] = min(self._best[key], ema)
        above = self._above[key] = (
            self._above.get(key, 0) + 1 if ema > (1 + self.rise) * best else 0
        )
        if above != self.persistence:
            return ()
        evidence = {
            f"{self.feature}_ema": ema,
            f"{self.feature}_best_ema": best,
            "ratio": ema / best if best else 0.0,
            "steps_above": float(above),
        }
        return (
            Finding(
                "divergence",
                key,
                ema / best if best else 0.0,
                Severity.WARN,
                frame.time,
                frame.step,
                evidence,
                self.name,
            ),
        )
