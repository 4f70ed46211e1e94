"""Slow drifts of one rank against its peers: a memory leak found before it kills the rank.

A leak is no outlier at first: it starts inside the peers' spread and crosses it only
when much memory is gone. Its *trend* is unusual from the start. For each watched feature
the detector keeps each rank's last ``window`` reports of its value less the peer median
(so a change all ranks share, a checkpoint's staging buffers, is no trend), and estimates
the rank's slope robustly (Theil-Sen over the pairs half a window apart, in time). A rank
drifts when all those pairs rise (a sign test), its slope stands ``z`` robust standard
deviations above its peers' slopes, and, held for ``horizon_s``, the slope would add at
least ``min_rise`` of the value (an absolute floor: a drift too slow to matter within the
hour is no finding, however regular). It must hold for ``persistence`` reports; ranks
warming up after a launch take no part.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from collector.types import Subject
from collector.vocabulary import canonical_name
from detectors._buffer import Stepwise
from detectors._layout import RankLayout, to_slots
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
    ) -> None:
        if window < 4 or window % 2:
            raise DetectorError(f"trend window must be even and at least 4, got {window}")
        spec = dict(features if features is not None else DEFAULT_TRENDS)
        self.features = {canonical_name(k): str(v) for k, v in spec.items()}
        self.window, self.z, self.min_rise, self.horizon_s = window, z, min_rise, horizon_s
        self.persistence, self.clear, self.warmup = persistence, clear, warmup
        self.min_ranks = min_ranks
        self._names = tuple(self.features)
        self._layout = RankLayout()
        f, w = len(self._names), window
        self._y, self._t = np.zeros((0, f, w)), np.zeros((0, f, w))
        self._level = np.zeros((0, f))
        self._n, self._pos = np.zeros((0, f), dtype=np.int64), np.zeros((0, f), dtype=np.int64)
        self._count, self._quiet = np.zeros((0, f), dtype=np.int64), np.zeros((0, f), np.int64)
        self._fired = np.zeros((0, f), dtype=bool)
        self._calls = 0

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        slots = self._layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
        size = len(self._layout.ranks)
        self._grow(size)
        warm = np.ones(size, dtype=bool)
        if "since_launch" in batch.features:
            warm = to_slots(batch.column("since_launch"), slots, size) >= self.warmup
            self._n[~warm] = 0  # a relaunch starts the series again
        found: list[Finding] = []
        for j, name in enumerate(self._names):
            if name in batch.features:
                x = to_slots(batch.column(name), slots, size)
                found += self._feature(j, np.where(warm, x, np.nan), batch)
        return found

    def _feature(self, j: int, x: np.ndarray, batch: StepBatch) -> list[Finding]:
        seen = np.isfinite(x)
        if seen.sum() < self.min_ranks:
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            y = x - np.nanmedian(x)
        rows = np.flatnonzero(seen)
        pos = self._pos[rows, j]
        self._y[rows, j, pos], self._t[rows, j, pos] = y[rows], batch.time
        self._level[rows, j] = x[rows]
        self._pos[rows, j] = (pos + 1) % self.window
        self._n[rows, j] += 1
        full = seen & (self._n[:, j] >= self.window)
        # At scale the slopes are judged every fourth report: a leak is slow, and a slope
        # over a window moves little from one report to the next.
        self._calls += 1
        if full.sum() < self.min_ranks or (len(x) > 8192 and self._calls % 4):
            return []
        slope, rising = self._slopes(j, np.flatnonzero(full))
        return self._judge(j, full, slope, rising, batch)

    def _slopes(self, j: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Theil-Sen slope over the pairs half a window apart, and whether all rise."""
        w, h = self.window, self.window // 2
        order = (self._pos[rows, j][:, None] + np.arange(w)) % w
        y = np.take_along_axis(self._y[rows, j], order, axis=1)
        t = np.take_along_axis(self._t[rows, j], order, axis=1)
        dy, dt = y[:, h:] - y[:, :h], t[:, h:] - t[:, :h]
        with np.errstate(invalid="ignore", divide="ignore"):
            slopes = np.where(dt > 0, dy / dt, 0.0)  # reports at one time: no slope
        return np.median(slopes, axis=1), (dy > 0).all(axis=1) & (dt > 0).all(axis=1)

    def _judge(
        self, j: int, full: np.ndarray, slope: np.ndarray, rising: np.ndarray, batch: StepBatch
    ) -> list[Finding]:
        rows = np.flatnonzero(full)
        med = float(np.median(slope))
        scale = max(1.4826 * float(np.median(np.abs(slope - med))), 1e-12)
        rise = slope * self.horizon_s
        level = np.abs(self._level[rows, j])
        drifting = rising & ((slope - med) / scale > self.z) & (rise >= self.min_rise * level)
        count = self._count[rows, j] = (self._count[rows, j] + 1) * drifting
        quiet = self._quiet[rows, j] = (self._quiet[rows, j] + 1) * ~drifting
        self._fired[rows, j] &= quiet < self.clear
        new = (count >= self.persistence) & ~self._fired[rows, j]
        self._fired[rows[new], j] = True
        return [
            self._finding(int(rows[i]), j, float(slope[i]), float(rise[i]), med, scale, batch)
            for i in np.flatnonzero(new)
        ]

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
        self._y, self._t = np.pad(self._y, pad3), np.pad(self._t, pad3)
        self._level = np.pad(self._level, pad2)
        self._n, self._pos = np.pad(self._n, pad2), np.pad(self._pos, pad2)
        self._count, self._quiet = np.pad(self._count, pad2), np.pad(self._quiet, pad2)
        self._fired = np.pad(self._fired, pad2)
