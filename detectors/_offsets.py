"""Each rank's stable offset from its peers, learnt slowly and never from a fault.

GPUs are not alike: one is always 3 % slower, one always runs 5 °C warmer, one rank always
holds a little more memory. Compared raw, such a rank is an outlier for ever; compared
after its own offset is removed, it is an outlier only when it *changes*. The offset of a
rank is a running mean of ``value / peer median``, exact over the first ``1/alpha``
observations and exponentially weighted after, updated only while the rank is not
drifting out (so a fault is not learnt as the rank's nature).
"""

from __future__ import annotations

import numpy as np


def pick_columns(array: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The given columns of a column-major array, column-major too (``array[:, cols]``
    would be row-major, and arithmetic mixing the two orders is slow)."""
    picked: np.ndarray = array.T[cols].T
    return picked


SLOW_WEIGHT = 0.1  # of a drifting cell's learning, against a calm one's
_CENTRE_SAMPLE = 4096  # ranks whose factors give the median factor, at most (a stride)


class Offsets:
    """Per-slot, per-feature factors relative to the peer median.

    Args:
        enabled: per feature, whether it uses offsets (positive quantities compared by
            ratio; flags and rates that idle at 0 do not).
        alpha: the weight of a new observation once the running mean is full.
        settle: reports a cell's offset needs before the cell is judged.
    """

    def __init__(self, enabled: np.ndarray, alpha: float = 0.05, settle: int = 10) -> None:
        self.enabled, self.alpha, self.settle = np.asarray(enabled, dtype=bool), alpha, settle
        # Column-major: a step's arithmetic runs down each feature's column.
        self.factor = np.ones((0, len(self.enabled)), order="F")
        self.count = np.zeros((0, len(self.enabled)), order="F")
        self._settled = False

    def add(self, enabled: bool) -> None:
        """One more feature, with offsets or without."""
        self.enabled = np.append(self.enabled, enabled)
        self.factor = np.asfortranarray(np.pad(self.factor, ((0, 0), (0, 1)), constant_values=1.0))
        self.count = np.asfortranarray(np.pad(self.count, ((0, 0), (0, 1))))
        self._settled = False

    def grow(self, size: int) -> None:
        extra = size - len(self.factor)
        if extra > 0:
            pad = ((0, extra), (0, 0))
            self.factor = np.asfortranarray(np.pad(self.factor, pad, constant_values=1.0))
            self.count = np.asfortranarray(np.pad(self.count, pad))
            self._settled = False

    def learning(self) -> np.ndarray | None:
        """Cells whose offset rests on fewer than ``settle`` reports: they learn from
        every report and are not judged yet (None once every cell has settled)."""
        if self._settled:
            return None
        cells: np.ndarray = self.enabled & (self.count < self.settle)
        self._settled = not cells.any()
        return None if self._settled else cells

    def forget(self, rows: np.ndarray) -> None:
        """Starts the offsets of ``rows`` again (after a relaunch)."""
        if rows.any():
            self.count[rows] = 0.0
            self._settled = False

    def divide(self, x: np.ndarray, j: int, out: np.ndarray) -> None:
        """``x``, values of feature ``j``, with each rank's learnt factor divided out, into
        ``out``. (A feature without offsets keeps a factor of exactly 1: it is copied.)"""
        if self.enabled[j]:
            np.divide(x, self.factor[:, j], out=out)
        else:
            out[:] = x

    def learns(self, j: int, med: float) -> bool:
        """Whether feature ``j`` can learn from a step whose peer median is ``med``
        (positive quantities only: a ratio to a median of 0 or less means nothing)."""
        return bool(self.enabled[j]) and med > 0

    def learn(
        self,
        j: int,
        x: np.ndarray,
        med: float,
        calm: np.ndarray,
        slow: np.ndarray | None = None,
    ) -> None:
        """Updates feature ``j``'s factors from one step: ``x``, each rank's value with its
        factor divided out, and ``med`` their median, in the ``calm`` cells (finite,
        positive, not drifting out); the ``slow`` cells (drifting on average) learn at a
        tenth of the weight, so a lasting shift is found before it is learnt and a small
        one is still learnt in the end."""
        factor, count = self.factor[:, j], self.count[:, j]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = (x * factor) / med
        ok = calm & np.isfinite(ratio) & (ratio > 0)
        count += ok
        weight = np.maximum(1.0 / np.maximum(count, 1.0), self.alpha)
        if slow is not None:
            weight = np.where(slow, SLOW_WEIGHT * weight, weight)

        factor += np.where(ok, weight * (np.where(ok, ratio, 1.0) - factor), 0.0)
        self._centre(factor, count)

    @staticmethod
    def _centre(factor: np.ndarray, count: np.ndarray) -> None:
        """Keeps a feature's factors relative to the median rank's (its factor 1).

        Each step's reference is the median of the values with their factors divided
        out, so nothing ties the factors to 1: learnt from a skewed ratio (a data wait's
        mean over its median is above 1) they would all creep up together (a generated
        job's data waits: 20 times in 1,200 steps; exponential waits: 2,000 times in 400)
        and the divided values would shrink against the features' absolute floors."""
        stride = max(1, len(factor) // _CENTRE_SAMPLE)
        learnt = factor[::stride][count[::stride] > 0]
        if not len(learnt):
            return
        centre = float(np.median(learnt))
        if centre > 0 and abs(centre - 1.0) > 1e-3:
            factor /= centre
