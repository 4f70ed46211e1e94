"""Training numerics: loss and gradient-norm spikes against their recent history."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from collector.types import JOB, Frame, Subject
from collector.vocabulary import canonical_name
from detectors._series import JobSeries, RobustWindow, finite, job_frame, job_value
from detectors.errors import DetectorError
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity

_QUIET_QUANTILE = 0.9  # of the values' moves, for the quiet bar


@dataclass
class _Pending:
    """A spike waiting for the confirming series to react: the finding it will be, the
    confirming series' level and noise before it, and its values since."""

    finding: Finding
    level: float
    noise: float
    after: list[float] = field(default_factory=list)


@dataclass
class _State:
    window: RobustWindow
    confirm: RobustWindow
    above: int = 0
    below: int = 0
    fired: bool = False
    pending: _Pending | None = None
    moves: deque[float] = field(default_factory=deque)  # each value's rise over its level
    bar: float = 0.0  # the smallest rise that is a spike, as the moves say (``_move``)


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

    With a ``confirm`` series (the gradient norm's is the loss) a spike is a finding only
    when that series reacts: the median of its ``react`` values after the spike exceeds
    its level before it by ``react_z`` times its noise and by ``react_ratio`` of that
    level, or one of them is not finite. A gradient norm that jumps tenfold on one hard
    batch of a small model is clipped and forgotten; one that set training back shows in
    the loss for longer than a few steps (a quarter above its level over the median of ten
    steps, by default: the tiny preset's healthy loss rises 20 % for three steps after a
    clipped hard batch). A frame without the confirming series fires at once, as without
    ``confirm``.

    With ``quiet_ratio`` the bar follows the series' own noise: while the 90th percentile
    of how far each value's rise over its level strays from the median rise, over the last
    ``quiet_window`` values, is at most ``quiet_ratio / z``, the bar is ``quiet_ratio``
    instead of ``min_ratio``. A large batch's loss moves a per cent or two a step and a
    rise of half is a fault; the loss of a few dozen tokens moves a tenth or more and
    doubles now and then, healthy. A steady fall (early training) moves every rise alike
    and does not count as noise; every value counts, a spike too, so a series that keeps
    spiking is not quiet.

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
        confirm: str | None = None,
        react: int = 10,
        react_z: float = 6.0,
        react_ratio: float = 0.25,
        quiet_ratio: float | None = None,
        quiet_window: int = 50,
    ) -> None:
        if quiet_ratio is not None and not 0 < quiet_ratio <= min_ratio:
            raise DetectorError(
                f"quiet_ratio must be above 0 and at most min_ratio ({min_ratio}), "
                f"got {quiet_ratio!r}"
            )
        if quiet_window < 10:
            raise DetectorError(f"quiet_window must be at least 10 values, got {quiet_window}")
        self.quiet_ratio, self.quiet_window = quiet_ratio, quiet_window
        if reduce not in ("median", "max"):
            raise DetectorError(f"reduce must be 'median' or 'max', got {reduce!r}")
        if react < 1:
            raise DetectorError(f"react must be at least 1 value, got {react}")
        self.confirm = canonical_name(confirm) if confirm else None
        self.react, self.react_z, self.react_ratio = react, react_z, react_ratio
        self.reduce = reduce
        self.feature, self.kind = canonical_name(feature), kind
        self.name = kind
        self.z, self.min_ratio = z, min_ratio
        self.window, self.warmup, self.clear = window, warmup, clear
        self.recent = recent
        self._states: dict[Subject, _State] = {}
        # Max mode: the step in hand (its batch, the highest row, the median's rise) and
        # the level of the ranks' median.
        self._ranks: tuple[StepBatch, int, float] | None = None
        self._median = RobustWindow(window)

    def score_one(self, frame: Frame) -> float:
        """How many robust deviations above the baseline the value is (0 in warm-up)."""
        state = self._states.get(frame.subject)
        value = finite(frame, self.feature)
        if state is None or value is None or len(state.window) < self.warmup:
            return 0.0
        level, noise = state.window.local(self.recent)
        floor = max(noise, state.bar * abs(level) / self.z, 1e-12)
        return max(0.0, (value - level) / floor)

    def _move(self, state: _State, value: float) -> None:
        """Notes the value's rise over the series' level and sets the bar from the moves:
        ``quiet_ratio`` while the series is quiet, else ``min_ratio``."""
        if self.quiet_ratio is None or len(state.window) < self.warmup:
            return
        level, _ = state.window.local(self.recent)
        if level <= 0:
            return
        state.moves.append(value / level - 1.0)
        if len(state.moves) > self.quiet_window:
            state.moves.popleft()
        if len(state.moves) == self.quiet_window:
            moves = np.fromiter(state.moves, dtype=float)
            spread = float(np.quantile(np.abs(moves - np.median(moves)), _QUIET_QUANTILE))
            quiet = spread <= self.quiet_ratio / self.z
            state.bar = self.quiet_ratio if quiet else self.min_ratio

    def learn_one(self, frame: Frame) -> None:
        value = finite(frame, self.feature)
        if value is not None:
            self._state(frame.subject).window.add(value)

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        features = (self.feature, self.confirm) if self.confirm else (self.feature,)
        if self.reduce == "median":
            frame = job_frame(batch, features)
            return self.process(frame) if frame is not None else ()
        column = batch.column(self.feature)
        finite_rows = np.isfinite(column)
        if not finite_rows.any():
            return ()
        row = int(np.argmax(np.where(finite_rows, column, -np.inf)))
        values = {self.feature: float(column[row])}
        if self.confirm and (confirm := job_value(batch, self.confirm)) is not None:
            values[self.confirm] = confirm
        self._ranks = (batch, row, self._median_rise(batch))
        try:
            return self.process(Frame(JOB, batch.step, batch.time, values))
        finally:
            self._ranks = None

    def _median_rise(self, batch: StepBatch) -> float:
        """How far the step's median over ranks rose above its own level (a ratio less 1;
        0 before ``warmup`` steps). A rise past the bar (``min_ratio``, or ``quiet_ratio``
        while the job's series is quiet) is not learnt into it."""
        median = job_value(batch, self.feature)
        assert median is not None  # the caller saw a finite value
        window = self._median
        rise = 0.0
        if len(window) >= self.warmup:
            level, _ = window.local(self.recent)
            rise = median / level - 1.0 if level > 0 else 0.0
        if rise <= self._state(JOB).bar:
            window.add(median)
        return rise

    def process(self, frame: Frame) -> Sequence[Finding]:
        state = self._state(frame.subject)
        confirmed = self._react(state, frame)
        value = finite(frame, self.feature)
        if value is None:
            self._learn_confirm(state, frame)
            return confirmed
        self._move(state, value)
        score = self.score_one(frame)
        if score <= self.z:
            state.window.add(value)
            state.below += 1
            state.fired = state.fired and state.below < self.clear
            self._learn_confirm(state, frame)
            return confirmed
        state.below = 0
        if state.fired:
            self._learn_confirm(state, frame)
            return confirmed
        state.fired = True
        finding = self._finding(state, frame, value, score)
        if self.confirm and len(state.confirm) >= 3 and self.confirm in frame.values:
            level, noise = state.confirm.local(self.recent)
            state.pending = _Pending(finding, level, noise)
            self._learn_confirm(state, frame)
            return confirmed
        self._learn_confirm(state, frame)
        return (*confirmed, finding)

    def _learn_confirm(self, state: _State, frame: Frame) -> None:
        if self.confirm and (value := finite(frame, self.confirm)) is not None:
            state.confirm.add(value)

    def _react(self, state: _State, frame: Frame) -> tuple[Finding, ...]:
        """The pending spike's finding once the confirming series reacted to it."""
        pending = state.pending
        if pending is None or self.confirm is None or self.confirm not in frame.values:
            return ()
        value = float(frame.values[self.confirm])
        broke = not np.isfinite(value)
        if not broke:
            pending.after.append(value)
        if not broke and len(pending.after) < self.react:
            return ()
        state.pending = None
        after = float(np.median(pending.after)) if pending.after else pending.level
        bar = max(self.react_z * pending.noise, self.react_ratio * abs(pending.level))
        if not broke and after - pending.level <= bar:
            return ()
        evidence = {**pending.finding.evidence, f"{self.confirm}_baseline": pending.level}
        if broke:
            evidence[f"{self.confirm}_non_finite"] = 1.0
        else:
            evidence[f"{self.confirm}_after"] = after
        return (replace(pending.finding, evidence=evidence),)

    def _finding(self, state: _State, frame: Frame, value: float, score: float) -> Finding:
        med, _ = state.window.local(self.recent)
        evidence = {
            self.feature: value,
            f"{self.feature}_baseline": med,
            "ratio": value / med if med else 0.0,
            "robust_z": score,
            "bar_ratio": state.bar,
        }
        subject = frame.subject
        if self._ranks is not None:  # the highest rank's spike: its rank, or the job's
            batch, row, median_rise = self._ranks
            subject = self._spiking(batch, row, median_rise, med, (value - med) / score, evidence)
        return Finding(
            self.kind,
            subject,
            score,
            Severity.WARN,
            frame.time,
            frame.step,
            evidence,
            self.name,
        )

    def _spiking(
        self,
        batch: StepBatch,
        row: int,
        median_rise: float,
        level: float,
        floor: float,
        evidence: dict[str, float],
    ) -> Subject:
        """The subject of a spike of the highest rank: that rank, or the job when the
        ranks' median rose at least half as much as the highest rank (against their own
        levels) or more than half the ranks are above the highest rank's bar: a spike of
        the whole job's loss is no one rank's bad batch. Both go into ``evidence``."""
        column = batch.column(self.feature)
        reported = np.isfinite(column)
        with np.errstate(invalid="ignore"):
            spiking = int(np.count_nonzero(column > level + self.z * floor))
        rise = float(column[row]) / level - 1.0 if level > 0 else 0.0
        evidence["ranks_spiking"] = float(spiking)
        evidence["median_rise"] = median_rise
        if median_rise >= 0.5 * rise or spiking > np.count_nonzero(reported) / 2:
            return JOB
        return batch.subject(row)

    def _state(self, subject: Subject) -> _State:
        state = self._states.get(subject)
        if state is None:
            state = self._states[subject] = _State(
                RobustWindow(self.window),
                RobustWindow(self.window if self.confirm else 1),
                bar=self.min_ratio,
            )
        return state


def loss_spike(**params: float) -> SeriesSpike:
    """A SeriesSpike on ``loss`` (kind ``loss_spike``)."""
    return SeriesSpike("loss", "loss_spike", **params)  # type: ignore[arg-type]


def grad_norm_spike(**params: float) -> SeriesSpike:
    """A SeriesSpike on ``grad_norm`` (kind ``grad_spike``) that the loss must confirm.

    A gradient-norm spike the loss does not follow is a hard batch, clipped and forgotten
    (a small model's healthy norm jumps tenfold now and then); one that set training back
    raises the loss of the steps after it. ``confirm=""`` judges the norm alone.
    """
    params.setdefault("confirm", "loss")  # type: ignore[arg-type]
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
