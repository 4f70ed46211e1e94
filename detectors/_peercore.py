"""The peer comparison shared by the peer detectors: one step of every rank at once.

For each watched feature, each rank's value (its own stable offset divided out) is
compared with the median of its peers. A report beats the bar when its deviation, in the
feature's direction, beats the largest of three bars: ``z`` robust standard deviations of the
peers, ``min_shift`` times the median, and the feature's absolute floor (a shift too
small to matter is no finding, however unusual). A rank is out when at least three of its
last five reports of the feature beat the bar (so the hiccups of heavy-tailed step times,
even two in a row, are no shift), and fires when it has been out for ``persistence``
reports; it must be well inside (under half the bar) for ``clear`` reports before it may
fire again.
Ranks within ``warmup`` steps of their launch take no part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors._layout import RankLayout, to_slots
from detectors._offsets import Offsets
from detectors.stepbatch import StepBatch

_SAMPLE = 8192  # ranks used to estimate median and MAD; a 1-2 % error at any job size
_VOTES, _OF = 3, 5  # reports that must beat the bar among the last ones
_POPCOUNT = np.array([bin(i).count("1") for i in range(1 << _OF)], dtype=np.int8)
_KEEP = (1 << _OF) - 1


@dataclass(frozen=True)
class Comparison:
    """One step's comparison, in slot order (rows are slots, columns features)."""

    x: np.ndarray
    med: np.ndarray
    scale: np.ndarray
    new: np.ndarray  # newly confirmed outliers
    together: np.ndarray  # cells drifting out with them (for node and replica findings)


def nanmedian_columns(x: np.ndarray) -> np.ndarray:
    """The median of each column over its non-NaN values (NaN for a column without any):
    np.nanmedian's result, without its slow masked path for small arrays."""
    if not np.isnan(x).any():
        fast: np.ndarray = np.median(x, axis=0)  # a partition, not a sort
        return fast
    ordered = np.sort(x, axis=0)  # NaN sorts last
    count = (~np.isnan(x)).sum(axis=0)
    cols = np.arange(x.shape[1])
    low = ordered[np.maximum((count - 1) // 2, 0), cols]
    high = ordered[np.maximum(count // 2, 0), cols]
    med: np.ndarray = np.where(count > 0, (low + high) / 2.0, np.nan)
    return med


class PeerCore:
    """State of the comparison: features (which may be added), offsets, persistence."""

    def __init__(
        self, z: float, persistence: int, clear: int, warmup: int, offset_alpha: float
    ) -> None:
        self.z, self.persistence, self.clear, self.warmup = z, persistence, clear, warmup
        self.names: list[str] = []
        self._sign = np.zeros(0)
        self._shift = np.zeros(0)
        self._abs = np.zeros(0)
        self._votes = np.zeros(0, dtype=np.int8)
        self._persist = np.zeros(0, dtype=np.int32)
        self.layout = RankLayout()
        self.offsets = Offsets(np.zeros(0, dtype=bool), offset_alpha)
        self.count = np.zeros((0, 0), dtype=np.int32)
        self.normal = np.zeros((0, 0), dtype=np.int32)
        self.fired = np.zeros((0, 0), dtype=bool)
        self._bits = np.zeros((0, 0), dtype=np.uint8)  # which of the last reports beat it
        self._active = np.zeros(0, dtype=bool)  # slots with any state worth updating
        self._seen = np.zeros((0, 0), dtype=np.int8)  # reports so far, up to _OF
        self._rng = np.random.default_rng(0)
        self._sample: np.ndarray | None = None
        self._sample_n = 0
        self._calls = 0

    def add(
        self,
        name: str,
        sign: int,
        shift: float,
        min_abs: float,
        offset: bool,
        votes: int = _VOTES,
        persistence: int | None = None,
    ) -> None:
        """Watches one more feature (``sign`` +1 high is bad, -1 low is bad, 0 either);
        ``votes`` of its last five reports must beat the bar (a clean flag needs one)."""
        self.names.append(name)
        self._votes = np.append(self._votes, np.int8(min(max(votes, 1), _OF)))
        self._persist = np.append(self._persist, persistence or self.persistence)
        self._sign = np.append(self._sign, float(sign))
        self._shift = np.append(self._shift, shift)
        self._abs = np.append(self._abs, min_abs)
        pad = ((0, 0), (0, 1))
        self.count, self.normal = np.pad(self.count, pad), np.pad(self.normal, pad)
        self.fired = np.pad(self.fired, pad)
        self._bits, self._seen = np.pad(self._bits, pad), np.pad(self._seen, pad)
        self.offsets.add(offset)

    def compare(self, batch: StepBatch, raw: np.ndarray, min_ranks: int) -> Comparison | None:
        """Updates persistence with one step's ``raw`` values (rows of ``batch``)."""
        slots = self.layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
        size = len(self.layout.ranks)
        self._grow(size)
        x = to_slots(raw, slots, size)
        if "since_launch" in batch.features:  # warming ranks take no part
            warming = to_slots(batch.column("since_launch"), slots, size) < self.warmup
            x = np.where(warming[:, None], np.nan, x)
            self.offsets.forget(warming)  # a relaunched rank may hold memory differently
        reported = np.isfinite(x)
        if reported.any(axis=1).sum() < min_ranks:
            return None
        x = self.offsets.remove(x)
        med, scale = self._peer_stats(x)
        signed = x - med
        dev = signed * self._sign
        if (self._sign == 0).any():
            dev = np.where(self._sign == 0, np.abs(signed), dev)
        bar = np.maximum(np.maximum(self.z * scale, self._shift * np.abs(med)), self._abs)
        learning = self.offsets.learning()  # offsets not known yet: learn, do not judge
        with np.errstate(invalid="ignore"):
            beats = dev > bar
        if learning is not None:
            beats &= ~learning
        self._calls += 1
        if len(x) <= _SAMPLE or self._calls % 4 == 0:  # at scale, offsets learn every 4th
            self.offsets.learn(x * self.offsets.factor, med, self._calm(signed, bar, learning))
        self._seen = np.minimum(self._seen + reported, _OF).astype(np.int8)
        # Only ranks out now or with state (recent reports beyond the bar, a count, a
        # fired finding) need the rest; at 100k ranks they are a handful.
        rows = np.flatnonzero(beats.any(axis=1) | self._active)
        new = np.zeros(x.shape, dtype=bool)
        if len(rows):
            calm = self._calm(signed[rows], bar, None if learning is None else learning[rows])
            new[rows] = self._update(rows, beats[rows], reported[rows], calm)
        # A node's other ranks count as going out with it when they are out too, or beat
        # the bar now: noise alone must not make one rank's fault its node's.
        together = beats | (self.count > 0) if new.any() else beats
        return Comparison(x, med, scale, new, together)

    @staticmethod
    def _calm(signed: np.ndarray, bar: np.ndarray, learning: np.ndarray | None) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            calm: np.ndarray = np.abs(signed) < 0.5 * bar
        return calm if learning is None else calm | learning

    def _update(
        self, rows: np.ndarray, beats: np.ndarray, reported: np.ndarray, calm: np.ndarray
    ) -> np.ndarray:
        """Votes, persistence and re-arming of the given slots; their newly confirmed cells.
        A rank is out when at least ``votes`` of its last five reports beat the bar (all of
        them while it has fewer reports than that) and this one does too."""
        shifted = ((self._bits[rows].astype(np.int16) << 1) | beats) & _KEEP
        bits = np.where(reported, shifted, self._bits[rows]).astype(np.uint8)
        self._bits[rows] = bits
        out = (_POPCOUNT[bits] >= np.minimum(self._seen[rows], self._votes)) & beats
        count = np.where(reported, (self.count[rows] + 1) * out, self.count[rows])
        normal = np.where(reported, (self.normal[rows] + 1) * calm, self.normal[rows])
        fired = self.fired[rows] & (normal < self.clear)
        self.count[rows], self.normal[rows], self.fired[rows] = count, normal, fired
        self._active[rows] = (bits != 0).any(axis=1) | (count > 0).any(axis=1) | fired.any(axis=1)
        confirmed: np.ndarray = (count >= self._persist) & ~fired
        return confirmed

    def gather(self, batch: StepBatch) -> np.ndarray | None:
        """The batch's columns of the watched features (NaN where one is not reported);
        None when it reports none of them."""
        cols = [batch.features.index(f) if f in batch.features else -1 for f in self.names]
        if not cols or all(c < 0 for c in cols):
            return None
        if min(cols) >= 0:
            gathered: np.ndarray = batch.values[:, cols]  # one gather when all are reported
            return gathered
        raw = np.full((len(batch.ranks), len(cols)), np.nan)
        for j, c in enumerate(cols):
            if c >= 0:
                raw[:, j] = batch.values[:, c]
        return raw

    def _peer_stats(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Median and MAD-based scale per feature, from a sample of ranks at large scale."""
        sample = x
        if len(x) > _SAMPLE:
            if self._sample is None or self._sample_n != len(x):
                # A fixed random subset per layout: drawing anew each step costs a shuffle.
                self._sample_n = len(x)
                self._sample = np.sort(self._rng.choice(len(x), _SAMPLE, replace=False))
            sample = x[self._sample]
        med = nanmedian_columns(sample)
        mad = nanmedian_columns(np.abs(sample - med))
        return med, np.maximum(1.4826 * mad, 1e-3 * np.abs(med) + 1e-12)

    def _grow(self, size: int) -> None:
        extra = size - len(self.count)
        if extra > 0:
            pad = ((0, extra), (0, 0))
            self.count, self.normal = np.pad(self.count, pad), np.pad(self.normal, pad)
            self.fired = np.pad(self.fired, pad)
            self._bits, self._seen = np.pad(self._bits, pad), np.pad(self._seen, pad)
            self._active = np.pad(self._active, (0, extra))
            self.offsets.grow(size)
