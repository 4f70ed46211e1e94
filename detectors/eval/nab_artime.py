"""ARTime on NAB: an adaptive resonance theory detector, as an evaluation family.

A numpy rendering of the design of Mark Hampton's ARTime (published as ARTimeNAB.jl, the
NAB detector with the top published standard score), written from its description here;
an evaluation design, not a shipped detector (docs/benchmarks.md, "NAB: ARTime").

How it works, per file, streaming, without labels:

- Downsampling. The series is cut into blocks of ``step`` points (one block per
  ``probation / (window * windows_per_probation)`` points, at least 1). A block is
  represented by its extreme on the side further from a running average of block means
  (an exponential average with weight 1/2), or by its mean when that extreme is within
  ``spike_min`` (10 %) of the mean.
- Levels. The block value is scaled by the file's range (``low``, ``high``) and rounded to
  one of ``levels`` (80) levels; a level within ``chomp`` of a running median level (one
  step of a histogram walk per block) snaps to that median: small wobbles around the
  typical level vanish.
- Features. The last ``window`` (8) levels, shifted and scaled to [0, 1], go through a
  full Haar wavelet transform whose coefficients are again scaled to [0, 1]; the feature
  vector is those 8 coefficients followed by the 8 raw levels (the shape of the recent
  stretch and where it sits). Complement coding doubles it to 32 values.
- Fuzzy ART with two vigilances. Each category is a weight vector; a sample's match with
  a category is ``(|min(x, w)| / |w|) ** 3 * e ** 2``, where ``e`` is the same ratio over
  the current level and its complement only (an "energy" term). Every category matching
  at or above the upper vigilance learns (its weights become ``min(x, w)``); else a best
  match at or above the lower vigilance commits the sample as a new category of the same
  cluster; else the sample founds a new cluster: an anomaly candidate.
- Start. The probation's features are replayed in a batch once the probation is over; the
  first vigilance is the mean best match of a trial network (vigilance ``initial_rho``)
  trained on the probation's samples ordered from least to most typical (by summed cosine
  similarity).
- Adaptive vigilance. Every half probation (and ``mask`` samples after an anomaly) the
  upper vigilance becomes the running mean of best matches (at most ``rho_ub_cap``); the
  lower one rises ``lb_rise`` of the way towards the lowest recent best match, or, when
  that lies below it, falls by half the mean shortfall of recent matches (never below the
  mean match of past anomalies).
- Masking. After a new cluster or a vigilance update, further new clusters are anomalies
  only when their best match is under ``0.7`` times the last anomaly's (``0.9`` in the
  ``mask`` samples right after an anomaly); the mask lifts after ``mask`` samples without
  a new cluster. An anomaly's score is a confidence in (0, 1] from how far its match sits
  under the two vigilances and from its energy term; every other point scores 0.

Choices made here: a category whose energy weights are both 0 (it has learned the lowest
and the highest level) matches the energy term fully, where the published code divides 0
by 0 (no such category arises on NAB's corpus); the Haar details are later minus earlier
value, as the Julia wavelet library's filters give them (the other sign lowers the NAB
screen by about a point). ``low``/``high`` are given by the caller: NAB hands every
detector the file's minimum and maximum (``range="file"``, what ARTime's published score
uses, and HTM's to set its encoder's resolution: a look at the whole file's range in
advance); ``file_range`` also gives ranges that look no further than the rows already
seen (the probation's, the running one, or the probation's stretched by the running one),
as the project's own detectors do.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_corpus import NabFile

Setting = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class ArtimeConfig:
    """ARTime's constants (the published values as defaults)."""

    window: int = 8
    windows_per_probation: int = 13
    levels: int = 80
    chomp: float = 0.075
    spike_min: float = 0.1
    initial_rho: float = 0.80
    rho_ub_cap: float = 0.97
    lb_rise: float = 0.19
    mask_factor: float = 1.5


class _Art:
    """Fuzzy ART with a lower and an upper vigilance over complement-coded samples."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.w = np.empty((64, 2 * dim))
        self.wsum = np.empty(64)
        self.n = 0
        self.rho_lb = 0.0
        self.rho_ub = 0.0

    def _add(self, sample: np.ndarray) -> None:
        if self.n == len(self.w):
            self.w = np.concatenate([self.w, np.empty_like(self.w)])
            self.wsum = np.concatenate([self.wsum, np.empty_like(self.wsum)])
        self.w[self.n] = sample
        self.wsum[self.n] = sample.sum()
        self.n += 1

    def train(self, features: np.ndarray, learning: bool = True) -> tuple[bool, float, float]:
        """One sample: (founded a new cluster, best match, its energy term).

        The first sample ever seen only creates the all-ones category (as the published
        code does) and reports a best match of 0.
        """
        x = np.concatenate([features, 1.0 - features])
        if self.n == 0:
            self._add(np.ones(2 * self.dim))
            return False, 0.0, 0.0
        w = self.w[: self.n]
        em = np.minimum(w, x)
        nw = self.wsum[: self.n].copy()
        nw[nw == 0.0] = 0.001
        feature = em.sum(axis=1) / nw
        e_num = em[:, self.dim - 1] + em[:, -1]
        e_den = w[:, self.dim - 1] + w[:, -1]
        energy = np.divide(e_num, e_den, out=np.ones(self.n), where=e_den > 0)
        match = feature**3 * energy**2
        best = int(np.argmax(match))
        top = float(match[best])
        if top <= 0.0:
            top, top_energy = 0.0, 0.0
        else:
            top_energy = float(energy[best])
        if not learning:
            return False, top, top_energy
        resonant = match >= self.rho_ub
        if resonant.any():
            self.w[: self.n][resonant] = em[resonant]
            self.wsum[: self.n][resonant] = em[resonant].sum(axis=1)
            return False, top, top_energy
        self._add(x)
        return top < self.rho_lb, top, top_energy


def _haar(block: np.ndarray) -> np.ndarray:
    """Full Haar transform of rows of length 2**k: [approximation, coarsest detail, ...,
    finest details] (details as later minus earlier value)."""
    out: list[np.ndarray] = []
    a = block
    while a.shape[1] > 1:
        even, odd = a[:, 0::2], a[:, 1::2]
        out.insert(0, (odd - even) / math.sqrt(2.0))
        a = (even + odd) / math.sqrt(2.0)
    return np.concatenate([a, *out], axis=1)


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = rows - rows.min(axis=1, keepdims=True)
    top = rows.max(axis=1, keepdims=True)
    return np.asarray(np.divide(rows, top, out=rows.copy(), where=top != 0), dtype=float)


def _levels(
    x: np.ndarray, step: int, low: np.ndarray, high: np.ndarray, cfg: ArtimeConfig
) -> np.ndarray:
    """The downsampled, levelled, median-snapped value of every block (``low`` and
    ``high``: the scaling range at every row; a block is scaled by its last row's)."""
    blocks = x[: (len(x) // step) * step].reshape(-1, step)
    means, tops, bottoms = blocks.mean(axis=1), blocks.max(axis=1), blocks.min(axis=1)
    m = len(means)
    average = np.empty(m)
    avg = means[0] if m else 0.0
    for k in range(m):
        avg = (avg + means[k]) / 2.0
        average[k] = avg
    ds = np.where(np.abs(tops - average) < np.abs(bottoms - average), bottoms, tops)
    ds = np.where(np.abs(ds - means) < cfg.spike_min * means, means, ds)
    ends = np.arange(len(means)) * step + step - 1
    lo, span = low[ends], high[ends] - low[ends]
    ds = np.divide(ds - lo, span, out=ds - lo, where=span != 0)
    level = np.clip(np.rint(ds * cfg.levels), 0, cfg.levels).astype(int)
    out = level / cfg.levels
    bins = np.zeros(cfg.levels + 1, dtype=int)
    med = below = above = 0
    for k in range(m):
        lv = int(level[k])
        bins[lv] += 1
        if k == 0:
            med = lv
        if med > lv:
            below += 1
        elif med < lv:
            above += 1
        half = (k + 1) // 2
        if half < above:
            below += bins[med]
            med += 1
            while bins[med] == 0:
                med += 1
            above -= bins[med]
        elif half < below:
            above += bins[med]
            med -= 1
            while bins[med] == 0:
                med -= 1
            below -= bins[med]
        centre = med / cfg.levels
        if abs(out[k] - centre) < cfg.chomp:
            out[k] = centre
    return np.asarray(out, dtype=float)


def _features(ds: np.ndarray, window: int) -> np.ndarray:
    """One feature row per block: zeros until ``window`` blocks are seen."""
    m = len(ds)
    feats = np.zeros((m, 2 * window))
    if m >= window:
        recent = np.lib.stride_tricks.sliding_window_view(ds, window)
        feats[window - 1 :] = np.concatenate([_unit(_haar(_unit(recent))), recent], axis=1)
    return feats


def _similarity(rows: np.ndarray) -> np.ndarray:
    """Cosine similarity between rows (1 less the other's norm when one norm is 0)."""
    norms = np.linalg.norm(rows, axis=1)
    safe = np.where(norms == 0, 1.0, norms)
    sim = (rows @ rows.T) / np.outer(safe, safe)
    zero = norms == 0
    sim[zero, :] = (1.0 - norms)[None, :]
    sim[:, zero] = (1.0 - norms)[:, None]
    np.fill_diagonal(sim, 1.0)
    return np.asarray(sim, dtype=float)


def _initial_rho(feats: np.ndarray, trend: int, cfg: ArtimeConfig) -> float:
    order = np.argsort(_similarity(feats).sum(axis=0), kind="stable")
    art = _Art(feats.shape[1])
    art.rho_lb = art.rho_ub = cfg.initial_rho
    matches = [art.train(f)[1] for f in feats[order]]
    return float(np.mean(matches[trend // 2 - 1 :]))


def artime_scores(
    values: np.ndarray,
    low: float | np.ndarray,
    high: float | np.ndarray,
    cfg: ArtimeConfig | None = None,
    probation: int | None = None,
) -> np.ndarray:
    """ARTime's anomaly score of every point: 0, or a confidence in (0, 1] at a detection.

    ``low`` and ``high`` scale the series: one range, or one per row (a block is scaled by
    the range at its last row); levels outside the range are clipped. ``probation``: the
    rows in which it only learns (None: NAB's, 15 % of the rows, at most 750).

    Raises:
        DetectorError: non-finite values or a series too short for a probation.
    """
    cfg = cfg or ArtimeConfig()
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)):
        raise DetectorError("ARTime needs finite values; drop or fill NaN rows")
    n = len(x)
    if probation is None:
        probation = math.floor(0.15 * n) if n < 5000 else 750
    probation -= probation % 2
    step = block_length(probation, cfg)
    trend = probation // step
    scores = np.zeros(n)
    if trend < 2 * cfg.window:
        raise DetectorError(
            f"ARTime needs a probation of at least {2 * cfg.window} blocks; "
            f"the series has {n} points (give it at least {int(2 * cfg.window / 0.15) + 1})"
        )
    lows = np.broadcast_to(np.asarray(low, dtype=float), x.shape)
    highs = np.broadcast_to(np.asarray(high, dtype=float), x.shape)
    feats = _features(_levels(x, step, lows, highs, cfg), cfg.window)
    mask = int(cfg.window * cfg.mask_factor)
    art = _Art(feats.shape[1])
    rho = _initial_rho(feats[cfg.window - 1 : trend], trend, cfg)
    art.rho_lb = art.rho_ub = rho
    last_anomaly, last_sim, last_update = 0, 0.0, 0
    mask_after_cat, calm = False, 0
    history: list[float] = []
    sims = np.ones(trend // 2 + 1)
    shortfalls = np.zeros(trend + 1)
    match_sum = 0.0
    for k in range(len(feats)):
        i = k + 1  # the published code counts blocks from 1
        since = i - last_anomaly
        if i > trend + mask and mask_after_cat and calm >= mask:
            mask_after_cat = False
        if i < cfg.window:
            _, top, energy = art.train(feats[k], learning=False)
            new = True
        else:
            new, top, energy = art.train(feats[k])
        calm = 0 if new else calm + 1
        match_sum += top
        sims[:-1] = sims[1:]
        sims[-1] = top
        shortfalls[:-1] = shortfalls[1:]
        shortfalls[-1] = art.rho_ub - top
        if since < mask and history:
            history[-1] = min(history[-1], top)
        masked = mask_after_cat or since <= mask
        below_last = top < last_sim * (0.9 if since <= mask else 0.7)
        if i > trend and new and (not masked or below_last):
            scores[(k + 1) * step - 1] = _confidence(top, energy, art)
            history.append(top)
            last_sim, last_anomaly = top, i
        mask_after_cat = new or mask_after_cat
        if i > trend and (since == mask or i - last_update >= trend // 2):
            _adapt(art, sims, shortfalls, history, match_sum / i, i > 2 * trend, cfg)
            last_update = i
            mask_after_cat = True
    return scores


def block_length(probation: int, cfg: ArtimeConfig | None = None) -> int:
    """Rows a block (one downsampled value) covers, for a file of the given probation."""
    cfg = cfg or ArtimeConfig()
    probation -= probation % 2
    return max(1, probation // (cfg.window * cfg.windows_per_probation))


def _confidence(top: float, energy: float, art: _Art) -> float:
    gap = 1.0 - min(0.999, top)
    upper = (gap - (1.0 - art.rho_ub)) / gap
    lower = (gap - (1.0 - art.rho_lb)) / gap
    return round(min(1.0, 0.35 * upper + 0.65 * lower + 1.5 * (1.0 - energy)), 6)


def _adapt(
    art: _Art,
    sims: np.ndarray,
    shortfalls: np.ndarray,
    history: list[float],
    mean_match: float,
    settled: bool,
    cfg: ArtimeConfig,
) -> None:
    upper = min(cfg.rho_ub_cap, mean_match)
    lowest = float(sims.min())
    if art.rho_lb <= lowest:
        lower = art.rho_lb + (lowest - art.rho_lb) * cfg.lb_rise
    else:
        drop = 0.0
        if settled:
            short = shortfalls[shortfalls > 0.05]
            if len(short):
                drop = float(np.minimum(short, 0.37).mean())
        lower = art.rho_lb - max(0.01, drop) / 2.0
        if history:
            lower = max(float(np.mean(history)), lower)
    art.rho_lb, art.rho_ub = min(upper, lower), upper


#: ARTime's constants tried by the protocol, and the score threshold (NAB thresholds every
#: detector's score; ARTime's scores are 0 except at its detections).
GRID: dict[str, tuple[float, ...]] = {
    "initial_rho": (0.7, 0.8, 0.9),
    "chomp": (0.05, 0.075, 0.1),
    "lb_rise": (0.1, 0.19, 0.3),
    "threshold": (0.0, 0.3, 0.5, 0.7),
}
#: The published constants (and every detection kept) as a setting of ``GRID``.
PUBLISHED: Setting = (0.8, 0.075, 0.19, 0.0)
#: How a file is scaled (``file_range``) and the margins tried with each (the last axis
#: of a family's settings).
MARGINS: dict[str, tuple[float, ...]] = {
    "file": (0.0,),
    "running": (0.0,),
    "probation": (0.5,),
    "expanding": (0.5, 1.0, 2.0),
}
RANGES = tuple(MARGINS)


def file_range(
    values: np.ndarray, how: str, margin: float = 0.0
) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
    """The scaling range of a file.

    ``file``: its own min and max (NAB's inputMin and inputMax: the whole file's range,
    known in advance); ``probation``: the probation's range widened by ``margin`` times its
    span on each side; ``running``: at every row, the min and max of the rows up to it;
    ``expanding``: the widened probation range, stretched at every row to the min and max
    of the rows up to it. Only ``file`` looks past the probation.
    """
    x = np.asarray(values, dtype=float)
    if how == "file":
        return float(x.min()), float(x.max())
    if how == "running":
        return np.minimum.accumulate(x), np.maximum.accumulate(x)
    if how in ("probation", "expanding"):
        head = x[: max(probation_length(len(x)), 1)]
        lo, hi = float(head.min()), float(head.max())
        lo, hi = lo - margin * (hi - lo), hi + margin * (hi - lo)
        if how == "probation":
            return lo, hi
        return np.minimum(lo, np.minimum.accumulate(x)), np.maximum(hi, np.maximum.accumulate(x))
    raise DetectorError(f"range must be one of {', '.join(RANGES)}, got {how!r}")


class ArtimeFamily:
    """ARTime over ``GRID`` and the range's margins: a setting is (initial_rho, chomp,
    lb_rise, threshold, margin); the scores of each (initial_rho, chomp, lb_rise, margin)
    are computed once per file."""

    name = "artime"

    def __init__(
        self, grid: dict[str, tuple[float, ...]] | None = None, range_: str = "file"
    ) -> None:
        if range_ not in RANGES:
            raise DetectorError(f"range must be one of {', '.join(RANGES)}, got {range_!r}")
        self.grid = grid or GRID
        self.range = range_
        #: The published constants with the first margin of this range.
        self.published: Setting = (*PUBLISHED, MARGINS[range_][0])
        self._scores: dict[tuple[str, Setting], np.ndarray] = {}

    def settings(self) -> Iterable[Setting]:
        return list(itertools.product(*self.grid.values(), MARGINS[self.range]))

    def scores(self, f: NabFile, constants: Setting) -> np.ndarray:
        """ARTime's scores of one file with (initial_rho, chomp, lb_rise, margin)."""
        key = (f.name, constants)
        if key not in self._scores:
            initial_rho, chomp, lb_rise, margin = constants
            cfg = replace(ArtimeConfig(), initial_rho=initial_rho, chomp=chomp, lb_rise=lb_rise)
            low, high = file_range(f.values, self.range, margin)
            self._scores[key] = artime_scores(f.values, low, high, cfg)
        return self._scores[key]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        initial_rho, chomp, lb_rise, threshold, margin = setting
        out = []
        for f in files:
            s = self.scores(f, (initial_rho, chomp, lb_rise, margin))
            out.append((s > 0) & (s >= threshold))
        return out
