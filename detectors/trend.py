"""Slow drifts of one rank against its peers: a memory leak found before it kills the rank.

A leak is no outlier at first: it starts inside the peers' spread and crosses it only
when much memory is gone. Its *trend* is unusual from the start. For each watched feature
the detector keeps each rank's last ``window`` reports of its change since its first report
less the median change of the ranks reported with it (so a change all ranks share, a
checkpoint's staging buffers, is no trend, and ranks of different footprints, two pipeline
stages, may share an observation or not without moving each other), and estimates
the rank's slope robustly (Theil-Sen over the pairs half a window apart, in time). A rank
drifts when all those pairs rise (a sign test), its slope stands ``z`` robust standard
deviations above its peers' slopes (every rank's latest, when an observation carries only
some of them: a node's GPUs scraped at their own time), and, held for ``horizon_s``, the
slope would add at least ``min_rise`` of the value (an absolute floor: a drift too slow
to matter within the hour is no finding, however regular). It must hold for
``persistence`` reports; ranks warming up after a launch take no part, and a step a rank
reports again (a hung job's heartbeats and GPU polls) adds nothing to its series.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from collector.types import Subject
from collector.vocabulary import canonical_name
from detectors._buffer import Stepwise
from detectors._layout import RankLayout, to_slots
from detectors._median import median
from detectors.errors import DetectorError
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity

DEFAULT_TRENDS: Mapping[str, str] = {"mem_used": "memory_leak"}


class Trend(Stepwise):
    """Fires a feature's kind (``memory_leak`` for ``mem_used``) on a rank drifting up.

    Args:
        features: feature -> finding kind.
        window: reports per rank in the slope (even, at least 4).
        z: robust z of the rank's slope among its peers' slopes.
        min_rise: the share of the rank's value the drift must add within ``horizon_s``.
        horizon_s: the time over which a drift is judged to matter.
        persistence: consecutive reports the drift must hold.
        clear: reports without drift before a rank may fire again.
        warmup: steps after a (re)launch in which a rank takes no part.
        min_ranks: peers needed.
        spread_memory: judgements whose peers' spread of slopes is remembered; the scale
            is never below their median (0: only this judgement's). Among a host's 8
            ranks whose memory wanders, the 8 slopes agree now and then by chance, and a
            rank's wander then stood at z 6 to 15.
    """

    name = "trend"

    def __init__(
        self,
        features: Mapping[str, str] | None = None,
        window: int = 8,
        z: float = 6.0,
        min_rise: float = 0.05,
        horizon_s: float = 3600.0,
        persistence: int = 2,
        clear: int = 20,
        warmup: int = 20,
        min_ranks: int = 4,
        spread_memory: int = 0,
    ) -> None:
        if window < 4 or window % 2:
            raise DetectorError(f"trend window must be even and at least 4, got {window}")
        spec = dict(features if features is not None else DEFAULT_TRENDS)
        self.features = {canonical_name(k): str(v) for k, v in spec.items()}
        self.window, self.z, self.min_rise, self.horizon_s = window, z, min_rise, horizon_s
        self.persistence, self.clear, self.warmup = persistence, clear, warmup
        self.min_ranks = min_ranks
        if spread_memory < 0:
            raise DetectorError(f"trend spread_memory must be 0 or more, got {spread_memory}")
        self.spread_memory = spread_memory
        self._names = tuple(self.features)
        self._layout = RankLayout()
        # Per slot (and feature, and place in the window): column-major, so that one
        # feature's state over every slot is one contiguous column.
        f, w = len(self._names), window
        self._y, self._t = np.zeros((0, f, w), order="F"), np.zeros((0, f, w), order="F")
        self._level = np.zeros((0, f), order="F")
        # Each slot's first report since its (re)launch: the origin of its changes.
        self._first = np.zeros((0, f), order="F")
        self._n = np.zeros((0, f), dtype=np.int64, order="F")
        self._pos = np.zeros((0, f), dtype=np.int64, order="F")
        self._count = np.zeros((0, f), dtype=np.int64, order="F")
        self._quiet = np.zeros((0, f), dtype=np.int64, order="F")
        self._fired = np.zeros((0, f), dtype=bool, order="F")
        # Each slot's latest slope: the peers a rank's slope is judged against when an
        # observation carries only some ranks (a node's GPUs scraped at their own time).
        self._slope = np.zeros((0, f), order="F")
        # Each slot's step of its latest report: a job stuck on a step (a hang) keeps
        # sending the same values, which are no time series.
        self._step = np.zeros((0, f), order="F")
        # Per feature: the peers' spread of slopes at its last ``spread_memory`` judgements.
        self._spreads = [deque[float](maxlen=spread_memory) for _ in self._names]
        self._calls = 0

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        slots = self._layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
        size = len(self._layout.ranks)
        self._grow(size)
        warm = None  # every rank is past its warm-up
        if "since_launch" in batch.features:
            warm = to_slots(batch.column("since_launch"), slots, size) >= self.warmup
            self._n[~warm] = 0  # a relaunch starts the series again
            self._slope[~warm] = np.nan
        found: list[Finding] = []
        for j, name in enumerate(self._names):
            if name in batch.features:
                x = to_slots(batch.column(name), slots, size)
                found += self._feature(j, x if warm is None else np.where(warm, x, np.nan), batch)
        return found

    def _feature(self, j: int, x: np.ndarray, batch: StepBatch) -> list[Finding]:
        seen = np.isfinite(x)
        if seen.sum() < self.min_ranks:
            return []
        first = self._first[:, j]
        start = seen & (self._n[:, j] == 0)
        first[start] = x[start]
        seen &= self._step[:, j] != batch.step  # a step reported again adds nothing
        # Changes, not levels: the median level of the ranks in one observation would
        # move with which ranks it carries (a node of the heavier stage scraped at the
        # same moment as one of the lighter).
        change = x - first
        if np.isnan(x).any():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                y = change - np.nanmedian(change)
        else:
            y = change - median(change)  # np.nanmedian's number: with no NaN, np.median's
        self._record(j, seen, x, y, batch.time)
        self._step[seen, j] = batch.step
        full = seen & (self._n[:, j] >= self.window)
        # At scale the slopes are judged every fourth report: a leak is slow, and a slope
        # over a window moves little from one report to the next.
        self._calls += 1
        if full.sum() < self.min_ranks or (len(x) > 8192 and self._calls % 4):
            return []
        slope, rising, noise = self._slopes(j, np.flatnonzero(full))
        return self._judge(j, full, slope, rising, noise, batch)

    def _record(self, j: int, seen: np.ndarray, x: np.ndarray, y: np.ndarray, now: float) -> None:
        """Appends the reports of the ``seen`` slots to their windows of feature ``j``."""
        pos = self._pos[:, j]
        if seen.all() and len(pos) and (pos == pos[0]).all():
            # Every slot reported and all windows are in step (each report of the job's
            # ranks comes a step at a time): one column of the windows is written.
            at = int(pos[0])
            self._y[:, j, at], self._t[:, j, at] = y, now
            self._level[:, j] = x
            self._pos[:, j] = (at + 1) % self.window
            self._n[:, j] += 1
            return
        rows = np.flatnonzero(seen)
        pos = pos[rows]
        self._y[rows, j, pos], self._t[rows, j, pos] = y[rows], now
        self._level[rows, j] = x[rows]
        self._pos[rows, j] = (pos + 1) % self.window
        self._n[rows, j] += 1

    def _slopes(self, j: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Theil-Sen slope over the pairs half a window apart, whether all rise, and the
        standard error of such a slope from the pairs' own spread, pooled over the rows
        (the median row's median absolute deviation of its pair slopes, as a standard
        deviation, over the root of the pairs)."""
        w, h = self.window, self.window // 2
        pos = self._pos[rows, j]
        if len(rows) == len(self._pos) and len(pos) and (pos == pos[0]).all():
            # Every slot's window is full and in step: pair the columns of the window.
            # Pair k joins the window's k-th oldest report with the one h reports later.
            pairs = [((int(pos[0]) + k) % w, (int(pos[0]) + k + h) % w) for k in range(h)]
            ys, ts = self._y[:, j], self._t[:, j]
            dy = np.column_stack([ys[:, b] - ys[:, a] for a, b in pairs])
            dt = np.column_stack([ts[:, b] - ts[:, a] for a, b in pairs])
        else:
            order = (pos[:, None] + np.arange(w)) % w
            y = np.take_along_axis(self._y[rows, j], order, axis=1)
            t = np.take_along_axis(self._t[rows, j], order, axis=1)
            dy, dt = y[:, h:] - y[:, :h], t[:, h:] - t[:, :h]
        with np.errstate(invalid="ignore", divide="ignore"):
            slopes = np.where(dt > 0, dy / dt, 0.0)  # reports at one time: no slope
        rising = np.logical_and((dy > 0).all(axis=1), (dt > 0).all(axis=1))
        slope = _row_medians(slopes)
        spread = _row_medians(np.abs(slopes - slope[:, None]))
        finite = spread[np.isfinite(spread)]
        noise = _MEDIAN_SE * 1.4826 * median(finite) / np.sqrt(h) if len(finite) else 0.0
        return slope, rising, float(noise)

    def _judge(
        self,
        j: int,
        full: np.ndarray,
        slope: np.ndarray,
        rising: np.ndarray,
        noise: float,
        batch: StepBatch,
    ) -> list[Finding]:
        rows = np.flatnonzero(full)
        at: np.ndarray | slice = slice(None) if len(rows) == len(full) else rows
        self._slope[at, j] = slope
        peers = slope
        if len(rows) < len(full):  # some ranks not in this observation: their last slopes
            latest = self._slope[:, j]
            peers = latest[np.isfinite(latest)]
        med = median(peers)
        # The peers' spread of slopes, but never below what one slope's own noise allows:
        # among a host's 8 ranks the spread of 8 slopes can be far below it by chance, and
        # a rank's noise then stood at z 7 to 21 (a flat series wobbling by 0.3 %).
        spread = 1.4826 * median(np.abs(peers - med))
        scale = max(spread, self._usual_spread(j, spread), noise, 1e-12)
        rise = slope * self.horizon_s
        level = np.abs(self._level[at, j])
        drifting = rising & ((slope - med) / scale > self.z) & (rise >= self.min_rise * level)
        count = self._count[at, j] = (self._count[at, j] + 1) * drifting
        quiet = self._quiet[at, j] = (self._quiet[at, j] + 1) * ~drifting
        self._fired[at, j] &= quiet < self.clear
        new = (count >= self.persistence) & ~self._fired[at, j]
        self._fired[rows[new], j] = True
        return [
            self._finding(int(rows[i]), j, float(slope[i]), float(rise[i]), med, scale, batch)
            for i in np.flatnonzero(new)
        ]

    def _usual_spread(self, j: int, spread: float) -> float:
        """The median of the peers' spread of slopes over the feature's last
        ``spread_memory`` judgements, this one's included (0 when not kept)."""
        if self.spread_memory == 0:
            return 0.0
        kept = self._spreads[j]
        kept.append(spread)
        return float(np.median(kept))

    def _finding(
        self,
        slot: int,
        j: int,
        slope: float,
        rise: float,
        med: float,
        scale: float,
        batch: StepBatch,
    ) -> Finding:
        lay, name = self._layout, self._names[j]
        subject = Subject(
            int(lay.replicas[slot]), int(lay.ranks[slot]), str(lay.nodes[slot]) or None
        )
        evidence = {
            name: float(self._level[slot, j]),
            f"{name}_slope_per_s": slope,
            f"{name}_rise_per_horizon": rise,
            "peer_slope_median": med,
            "robust_z": (slope - med) / scale,
        }
        return Finding(
            self.features[name],
            subject,
            evidence["robust_z"],
            Severity.WARN,
            batch.time,
            batch.step,
            evidence,
            self.name,
        )

    def _grow(self, size: int) -> None:
        extra = size - len(self._n)
        if extra <= 0:
            return
        pad2, pad3 = ((0, extra), (0, 0)), ((0, extra), (0, 0), (0, 0))

        def padded(a: np.ndarray, pad: tuple[tuple[int, int], ...], fill: float = 0) -> np.ndarray:
            return np.asfortranarray(np.pad(a, pad, constant_values=fill))

        self._y, self._t = padded(self._y, pad3), padded(self._t, pad3)
        self._level, self._first = padded(self._level, pad2), padded(self._first, pad2)
        self._n, self._pos = padded(self._n, pad2), padded(self._pos, pad2)
        self._count, self._quiet = padded(self._count, pad2), padded(self._quiet, pad2)
        self._fired = padded(self._fired, pad2)
        self._slope, self._step = (
            padded(self._slope, pad2, np.nan),
            padded(self._step, pad2, np.nan),
        )


#: The standard error of a median over that of a mean, for normal noise (sqrt(pi / 2)).
_MEDIAN_SE = 1.2533


def _row_medians(x: np.ndarray) -> np.ndarray:
    """``np.median(x, axis=1)``. Rows of four (the default window's pairs) take a sorting
    network instead of a partition per row, several times faster and the same numbers bit
    for bit: the middle two values are the same whichever way they are found, their mean
    is taken the same way, and a NaN anywhere gives NaN. Only a -0.0 (equal to 0.0, so
    either might come out) sends the rows to np.median."""
    if x.shape[1] != 4 or (np.signbit(x) & (x == 0)).any():
        med: np.ndarray = np.median(x, axis=1)
        return med
    a, b, c, d = x[:, 0], x[:, 1], x[:, 2], x[:, 3]
    low = np.maximum(np.minimum(a, b), np.minimum(c, d))  # the second smallest
    high = np.minimum(np.maximum(a, b), np.maximum(c, d))  # the second largest
    out: np.ndarray = (low + high) / 2.0
    return out
