"""An anomaly-likelihood detector for the NAB protocol (Numenta's second stage, our first).

A measured design, not a shipped detector (docs/benchmarks.md, "NAB: an anomaly
likelihood family"). Numenta HTM's NAB detector is two stages: a raw score in [0, 1] (how
badly the model predicted this point) and an anomaly likelihood over it (the mean of the
last few raw scores against a Gaussian fitted to the long history of that mean; a point
is an anomaly when that tail probability is tiny). The raw score being bounded is the
point: a surprise saturates at 1 whatever its size, so a spike smaller than an earlier,
larger one is as anomalous as long as the series has been predictable lately, and a
series turning noisy raises the recent mean of surprises even when no single point is
extreme. The record detector (detectors/univariate.py) ranks by magnitude against its own
trailing record and misses both kinds on AWS CloudWatch.

Here the HTM model is replaced by a simple predictor (``predictor``: 0, the last value;
k > 0, the median of the last k values), after the seasonal residual when the probation
shows a season (``season_corr``, as the record detector). The raw score of a point is its
prediction error in robust z units of the trailing errors (``_robust_z``), divided by
``saturate`` and clipped to [0, 1]; a value beyond every value seen scores 1. The
likelihood's z is the mean raw score of the last ``short`` points against the mean and
standard deviation (floored at ``std_floor``) of that mean over the ``history`` points
before them (in probations; ``inf``: everything since the start, as Numenta's 8640-point
window covers a whole NAB file). A point is an anomaly when that z reaches ``z`` (a tail
probability of 1 - Phi(z): z 4.26 is Numenta's 1e-5), at most one a quarter probation,
none in the probation. ``RankMeanFamily``'s raw score is instead the mean of several
predictors' raw scores (an ensemble of bounded surprises).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from detectors._season import season_length
from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_corpus import NabFile
from detectors.univariate import _robust_z, _seasonal_residual

Setting = tuple[float, ...]

#: The constants tried: predictor (0: last value; k: median of the last k values), season
#: correlation (2.0: never a season), saturation (robust z of the error that scores 1),
#: short mean (points), history (probations; inf: since the start), the standard
#: deviation's floor, the likelihood's z.
LIKELIHOOD_GRID: dict[str, tuple[float, ...]] = {
    "predictor": (0.0, 8.0, 32.0),
    "season_corr": (0.8, 2.0),
    "saturate": (3.0, 6.0, 12.0),
    "short": (1.0, 10.0, 30.0),
    "history": (2.0, math.inf),
    "std_floor": (0.05, 0.1, 0.2),
    "z": (2.0, 2.5, 3.0, 3.5, 4.0, 5.0),
}


def bounded_surprise(
    values: np.ndarray, probation: int, predictor: int, season_corr: float, saturate: float
) -> np.ndarray:
    """Each point's prediction error as a raw score in [0, 1] (past points only); the
    first quarter probation scores 0."""
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)):
        raise DetectorError("the likelihood score needs finite values; drop or fill NaN rows")
    if predictor < 0 or saturate <= 0:
        raise DetectorError(
            f"predictor must be 0 or more and saturate above 0, got {predictor}, {saturate}"
        )
    s = pd.Series(x)
    season = season_length(x[:probation], season_corr)
    base = _seasonal_residual(s, season) if season else s
    guess = base.shift(1) if predictor == 0 else base.rolling(predictor, min_periods=1).median()
    if predictor:
        guess = guess.shift(1)
    error = (base - guess).fillna(0.0)
    z = _robust_z(error, max(probation, 50)).to_numpy()
    raw = np.clip(z / saturate, 0.0, 1.0)
    high, low = s.cummax().shift(1).to_numpy(), s.cummin().shift(1).to_numpy()
    with np.errstate(invalid="ignore"):
        raw[(x > high) | (x < low)] = 1.0
    raw[: probation // 4] = 0.0
    return raw


def likelihood_z(raw: np.ndarray, short: int, history: int | None, std_floor: float) -> np.ndarray:
    """How far the mean of the last ``short`` raw scores stands above the history of that
    mean over the ``history`` points before them (None: every point before them), in
    standard deviations floored at ``std_floor``. 0 until 20 points of history."""
    recent = pd.Series(np.asarray(raw, dtype=float)).rolling(short, min_periods=1).mean()
    past = recent.expanding(min_periods=20) if history is None else recent.rolling(history, 20)
    mean, std = past.mean().shift(short), past.std().shift(short)
    scale = np.maximum(std.fillna(0.0).to_numpy(), std_floor)
    z = ((recent - mean) / scale).fillna(0.0)
    return np.asarray(z, dtype=float)


def threshold_flags(z: np.ndarray, level: float, probation: int) -> np.ndarray:
    """Points whose likelihood z reaches ``level``, at most one a quarter probation, none
    in the probation."""
    suppress = max(probation // 4, 1)
    flags = np.zeros(len(z), dtype=bool)
    last = -(10**9)
    for i in np.flatnonzero(z >= level):
        if i < probation or i - last <= suppress:
            continue
        flags[i] = True
        last = int(i)
    return flags


def tail_probability(level: float) -> float:
    """The Gaussian tail probability 1 - Phi(level) of a likelihood z (Numenta's
    likelihood; a point is an anomaly when this is at most the threshold)."""
    return 0.5 * math.erfc(level / math.sqrt(2.0))


class LikelihoodFamily:
    """The likelihood detector over ``LIKELIHOOD_GRID`` (raw scores and z cached)."""

    name = "likelihood"

    def __init__(self, grid: dict[str, tuple[float, ...]] | None = None) -> None:
        self.grid = grid or LIKELIHOOD_GRID
        self._raw: dict[tuple[str, Setting], np.ndarray] = {}
        #: Only the last setting's z per file (settings run in grid order, so the z of
        #: the six levels is computed once without holding every z of the grid).
        self._z: dict[tuple[str, Setting], np.ndarray] = {}
        self._z_key: Setting = ()

    def settings(self) -> Iterable[Setting]:
        return list(itertools.product(*self.grid.values()))

    def raw(self, f: NabFile, key: Setting) -> np.ndarray:
        if (f.name, key) not in self._raw:
            predictor, season_corr, saturate = key
            probation = probation_length(len(f.values))
            self._raw[(f.name, key)] = bounded_surprise(
                f.values, probation, int(predictor), season_corr, saturate
            )
        return self._raw[(f.name, key)]

    def z(self, f: NabFile, setting: Setting) -> np.ndarray:
        key = setting[:-1]
        if key != self._z_key:
            self._z, self._z_key = {}, key
        if (f.name, key) not in self._z:
            short, history, std_floor = key[-3:]
            probation = probation_length(len(f.values))
            span = None if math.isinf(history) else int(history * max(probation, 50))
            raw = self.raw(f, key[:-3])
            self._z[(f.name, key)] = likelihood_z(raw, int(short), span, std_floor)
        return self._z[(f.name, key)]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        level = setting[-1]
        return [
            threshold_flags(self.z(f, setting), level, probation_length(len(f.values)))
            for f in files
        ]


def trailing_rank(scores: np.ndarray, start: int = 0) -> np.ndarray:
    """Each score's rank among the scores before it since ``start`` (the fraction below it,
    ties counted half), in [0, 1]; 0 before two scores are known. Causal."""
    x = np.asarray(scores, dtype=float)
    out = np.zeros(len(x))
    seen: list[float] = []
    for i in range(start, len(x)):
        v = float(x[i])
        if len(seen) >= 2:
            below = bisect.bisect_left(seen, v)
            equal = bisect.bisect_right(seen, v) - below
            out[i] = (below + 0.5 * equal) / len(seen)
        bisect.insort(seen, v)
    return out


#: The ensemble's members: the record detector's raw score (shipped constants with the
#: 32-point predictor), the likelihood z of the 32-point predictor's bounded surprise
#: (short 10, whole history), the same with a 1-point mean (a single surprise against the
#: history of surprises), and the unbounded 32-point prediction error (robust z).
RANK_MEMBERS = ("record", "likelihood", "surprise", "error")
#: The constants tried: which members (a bit mask over RANK_MEMBERS, at least two), the
#: mean rank that is an anomaly.
RANK_GRID: dict[str, tuple[float, ...]] = {
    "members": tuple(float(m) for m in range(16) if bin(m).count("1") >= 2),
    "level": (0.99, 0.995, 0.998, 0.999, 0.9995, 1.0),
}


def member_scores(values: np.ndarray, probation: int) -> dict[str, np.ndarray]:
    """Each RANK_MEMBERS score of a series (past points only)."""
    from detectors.univariate import RecordDetector

    raw = bounded_surprise(values, probation, 32, 0.8, 6.0)
    s = pd.Series(np.asarray(values, dtype=float))
    error = (s - s.rolling(32, min_periods=1).median().shift(1)).fillna(0.0)
    return {
        "record": RecordDetector(predictor=32).score(values, probation),
        "likelihood": likelihood_z(raw, 10, None, 0.05),
        "surprise": likelihood_z(raw, 1, None, 0.05),
        "error": _robust_z(error, max(probation, 50)).to_numpy(),
    }


def rank_mean(ranks: dict[str, np.ndarray], members: int) -> np.ndarray:
    """The mean trailing rank of the members in the bit mask ``members``."""
    chosen = [ranks[name] for j, name in enumerate(RANK_MEMBERS) if members >> j & 1]
    if len(chosen) < 1:
        raise DetectorError(f"members must name at least one of {RANK_MEMBERS}, got {members}")
    return np.asarray(np.mean(chosen, axis=0), dtype=float)


class RankMeanFamily:
    """Flags where the mean trailing rank of several scores reaches a level (RANK_GRID)."""

    name = "rank_mean"

    def __init__(self, grid: dict[str, tuple[float, ...]] | None = None) -> None:
        self.grid = grid or RANK_GRID
        self._ranks: dict[str, dict[str, np.ndarray]] = {}

    def settings(self) -> Iterable[Setting]:
        return list(itertools.product(*self.grid.values()))

    def ranks(self, f: NabFile) -> dict[str, np.ndarray]:
        if f.name not in self._ranks:
            probation = probation_length(len(f.values))
            start = probation // 4
            self._ranks[f.name] = {
                k: trailing_rank(v, start) for k, v in member_scores(f.values, probation).items()
            }
        return self._ranks[f.name]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        members, level = int(setting[0]), setting[1]
        out = []
        for f in files:
            mean = rank_mean(self.ranks(f), members)
            out.append(threshold_flags(mean, level - 1e-12, probation_length(len(f.values))))
        return out


#: The likelihood settings joined with the record detector (``LikelihoodRecordFamily``).
FUSION_LIKELIHOOD_GRID: dict[str, tuple[float, ...]] = {
    "predictor": (0.0, 32.0),
    "season_corr": (0.8,),
    "saturate": (6.0, 12.0),
    "short": (1.0, 10.0),
    "history": (math.inf,),
    "std_floor": (0.05, 0.2),
    "z": (3.0, 4.0, 5.0, 6.0),
}


class LikelihoodRecordFamily:
    """The record detector and the likelihood detector joined by a rule the grid chooses.

    A setting is (rule, the likelihood's seven constants, the record grid's seven); the
    rules are nab_families' RECORD (record alone), CAD (here: the likelihood alone),
    EITHER, BOTH (one fires and the other fired in the quarter probation before it).
    """

    name = "likelihood_fusion"

    def __init__(self) -> None:
        from detectors.eval.nab_discord import FUSION_RECORD_SETTINGS
        from detectors.eval.nab_families import RecordFamily

        self.record = RecordFamily()
        self.records = FUSION_RECORD_SETTINGS
        self.likelihood = LikelihoodFamily(FUSION_LIKELIHOOD_GRID)
        self._records: dict[Setting, list[np.ndarray]] = {}
        self._likelihoods: dict[Setting, list[np.ndarray]] = {}

    def settings(self) -> Iterable[Setting]:
        from detectors.eval.nab_families import BOTH, CAD, EITHER, RECORD

        ones = list(self.likelihood.settings())
        out = [(RECORD, *ones[0], *r) for r in self.records]
        out += [(CAD, *one, *self.records[0]) for one in ones]
        out += [(rule, *one, *r) for rule in (EITHER, BOTH) for one in ones for r in self.records]
        return out

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        from detectors.eval.nab_families import combine

        rule, one, record = setting[0], setting[1:8], setting[8:]
        if record not in self._records:
            self._records[record] = self.record.flags(files, record)
        if one not in self._likelihoods:
            self._likelihoods[one] = self.likelihood.flags(files, one)
        a, b = self._records[record], self._likelihoods[one]
        return [
            combine(x, y, rule, probation_length(len(f.values)))
            for x, y, f in zip(a, b, files, strict=True)
        ]
