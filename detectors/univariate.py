"""A univariate detector for single series (NAB-style ``timestamp,value`` files).

Scores each point causally (only past points) with the largest of three surprises:
  * the robust z-score of the value against the trailing ``window`` points (of its
    departure from the median of the last three seasons when the probation shows a
    season: autocorrelation at least ``season_corr`` at some lag, so a daily pattern is
    not itself a surprise, and the median keeps one odd day from echoing a season later);
  * the same for the mean of the last ``smooth`` points (level shifts that no single
    point shows), damped by 0.7;
  * with ``predictor`` k > 0, the same for a short-term predictor's error: the value less
    the median of its last k values (a change against the recent level, which the
    trailing baseline of ``window`` points takes long to follow);
  * novelty: how far the value leaves the range of everything seen so far.
Scores are capped at ``ceiling`` (a robust z of 100 is as sure as any; without the cap a
value leaving a still-narrow early range stands as a record no later event can beat). The
first ``warmup`` points score 0: their baselines rest on too few points, and their
inflated scores would otherwise stand as records against the first real events. The
detector then chooses its own threshold without labels. A point is a candidate when its score
beats ``floor`` and every score of the trailing ``record_window`` points (a record; rare in
stationary data, about one per window, whatever the series' scale), or when it beats
``floor`` while the mean score of the last ``sustain`` points stands ``sustain_z`` standard
deviations above the history of that mean over the same trailing ``record_window`` points
(a lasting change no single point shows; the anomaly-likelihood idea of Numenta's
detectors: the recent mean score against the distribution of such means). While
nothing has fired for ``quiet`` points (and before the first alarm), a score above
``relaxed`` times the record is a candidate too: a series that has been calm for long
earns a lower bar. A candidate is an anomaly when the last anomaly is more than
``suppress`` points ago.

After the probation every quantity at a point uses only that point and earlier ones, so the
verdicts on a prefix of a series are the verdicts on the whole series cut to that prefix
(the detector is online: one pass, no look-ahead); the probation length is the only thing
it is told about the file. The season is measured on the probation once it is over, before
any verdict is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from detectors._season import season_length
from detectors.errors import DetectorError


@dataclass(frozen=True)
class SeriesResult:
    """Per-point scores in [0, 1] and the points the detector flags."""

    scores: np.ndarray
    flags: np.ndarray


def _robust_z(s: pd.Series, window: int, min_periods: int = 20) -> pd.Series:
    med = s.rolling(window, min_periods=min_periods).median().shift(1)
    mad = (s - med).abs().rolling(window, min_periods=min_periods).median().shift(1)
    roll = s.rolling(window, min_periods=min_periods)
    spread = (roll.max() - roll.min()).shift(1).fillna(0.0)
    # The range floor keeps a flat stretch (MAD 0) from turning every wiggle into infinity.
    scale = np.maximum(1.4826 * mad, 0.02 * spread) + 1e-9
    return ((s - med).abs() / scale).fillna(0.0)


def _seasonal_residual(s: pd.Series, season: int, seasons: int = 3) -> pd.Series:
    """Each value less the median of the values 1, 2 .. ``seasons`` seasons before it."""
    before = pd.concat([s.shift(k * season) for k in range(1, seasons + 1)], axis=1)
    return (s - before.median(axis=1)).fillna(0.0)


class RecordDetector:
    """Self-thresholding univariate anomaly detector (see the module docstring).

    Args:
        window: trailing points for the baseline; None uses the probation length.
        smooth: points averaged for the level-shift score.
        floor: the smallest score that can be an anomaly (robust z units).
        record_window: trailing points a score must beat, and the history the sustained
            trigger compares against; None: four probation lengths.
        suppress: points after an anomaly in which no other fires; None: a quarter of the
            probation length.
        sustain: points averaged for the sustained-surprise trigger.
        sustain_z: standard deviations that trigger it.
        quiet: points without an anomaly after which the relaxed bar applies; None: four
            probation lengths.
        relaxed: the fraction of the record a score must beat after a quiet spell.
        warmup: leading points whose score is 0; None: a quarter of the probation length.
        season_corr: the autocorrelation over the probation that makes a lag a season;
            above 1 never finds one.
        ceiling: the largest score.
        predictor: points whose median predicts the next value; the robust z of the
            prediction error joins the score. 0 (the default): no predictor.

    >>> x = np.sin(np.arange(600) / 5.0)
    >>> x[450] = 6.0
    >>> RecordDetector().detect(x, probation=100).flags.nonzero()[0].tolist()
    [450]
    """

    def __init__(
        self,
        window: int | None = None,
        smooth: int = 8,
        floor: float = 4.0,
        record_window: int | None = None,
        suppress: int | None = None,
        sustain: int = 20,
        sustain_z: float = 3.0,
        quiet: int | None = None,
        relaxed: float = 0.5,
        warmup: int | None = None,
        season_corr: float = 0.8,
        ceiling: float = 100.0,
        predictor: int = 0,
    ) -> None:
        self.window, self.smooth, self.floor = window, smooth, floor
        self.record_window, self.suppress = record_window, suppress
        self.sustain, self.sustain_z = sustain, sustain_z
        self.quiet, self.relaxed, self.warmup = quiet, relaxed, warmup
        self.season_corr, self.ceiling = season_corr, ceiling
        if predictor < 0:
            raise DetectorError(f"predictor must be 0 (off) or a number of points, got {predictor}")
        self.predictor = predictor

    def _history(self, probation: int) -> int:
        return self.record_window or 4 * max(probation, 50)

    def score(self, values: np.ndarray, probation: int) -> np.ndarray:
        """The raw surprise of each point (robust z units), from past points only."""
        s = pd.Series(np.asarray(values, dtype=float))
        window = self.window or max(probation, 50)
        season = season_length(s.to_numpy()[:probation], self.season_corr)
        base = _seasonal_residual(s, season) if season else s
        point = _robust_z(base, window)
        if self.predictor:
            error = base - base.rolling(self.predictor, min_periods=1).median().shift(1)
            point = pd.Series(np.maximum(point, _robust_z(error.fillna(0.0), window)))
        level = _robust_z(base.rolling(self.smooth, min_periods=1).mean(), window) * 0.7
        high, low = s.cummax().shift(1), s.cummin().shift(1)
        span = (high - low).replace(0.0, np.nan)
        beyond = pd.Series(np.maximum(s - high, low - s)) / span
        novelty = 20.0 * beyond.clip(lower=0.0).fillna(0.0)
        raw = np.minimum(np.maximum(np.maximum(point, level), novelty), self.ceiling)
        raw = np.array(raw, dtype=float)
        raw[: self.warmup if self.warmup is not None else probation // 4] = 0.0
        return raw

    def sustained(self, raw: np.ndarray, probation: int) -> np.ndarray:
        """How unusual the recent mean score is against the history of that mean (z units)."""
        recent = pd.Series(raw).rolling(self.sustain, min_periods=1).mean()
        history = recent.rolling(self._history(probation), min_periods=20)
        mean = history.mean().shift(self.sustain)
        std = history.std().shift(self.sustain)
        return np.asarray(((recent - mean) / (std + 1e-9)).fillna(0.0), dtype=float)

    def detect(self, values: np.ndarray, probation: int) -> SeriesResult:
        """Scores and flags a whole series; ``probation`` points only learn."""
        raw = self.score(values, probation)
        record = pd.Series(raw).rolling(self._history(probation), min_periods=1).max().shift(1)
        record_arr = record.fillna(np.inf).to_numpy()
        lasting = self.sustained(raw, probation)
        beats_floor = raw > self.floor
        strong = beats_floor & ((raw > record_arr) | (lasting > self.sustain_z))
        near_record = beats_floor & (raw > self.relaxed * record_arr)
        suppress = self.suppress if self.suppress is not None else max(probation // 4, 1)
        quiet = self.quiet if self.quiet is not None else 4 * max(probation, 50)
        flags = np.zeros(len(raw), dtype=bool)
        last = -(10**9)
        for i in np.flatnonzero(strong | near_record):
            if i < probation or i - last <= suppress:
                continue
            if strong[i] or i - last > quiet:
                flags[i] = True
                last = int(i)
        reference = np.maximum(np.where(np.isfinite(record_arr), record_arr, raw), self.floor)
        scores = np.clip(raw / (2.0 * reference), 0.0, 1.0)
        scores[flags] = np.maximum(scores[flags], 0.5)
        scores[:probation] = 0.0
        return SeriesResult(scores, flags)
