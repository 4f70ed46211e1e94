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

A shift too small for that bar in any one report is plain over several. For a feature
marked ``sustained``, each cell keeps an exponentially weighted mean (weight
``SUSTAINED_WEIGHT``) of its reports' robust z (each clipped at ``SUSTAINED_CLIP``, so one
heavy-tailed hiccup moves it little) and of its relative deviation. The cell also beats
the bar when that mean z is above ``sustained_z`` and the mean deviation clears the
relative and absolute floors. Under heavy-tailed noise a GPU that became 10 % slower may
stand only three or four deviations out in any one report, but it stays there, which
independent noise does not: the mean z of healthy noise has a standard deviation near
0.4. While a cell drifts (its mean z above half that bar) its offset learns at a tenth of
its weight, so a lasting shift (a leak's ramp) is found before it is taken for the
rank's nature, and a small one is still taken in the end; while it departs (its mean
shift above half the floor too) it is not well inside and counts with its node. A cell's
means start once its offset rests on ``SUSTAINED_SETTLE`` reports.
Ranks within ``warmup`` steps of their launch take no part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors._layout import RankLayout, to_slots
from detectors._median import median_columns, middle
from detectors._offsets import Offsets, pick_columns
from detectors.stepbatch import StepBatch, column_major

_SAMPLE = 8192  # ranks used to estimate median and MAD; a 1-2 % error at any job size
_VOTES, _OF = 3, 5  # reports that must beat the bar among the last ones
_POPCOUNT = np.array([bin(i).count("1") for i in range(1 << _OF)], dtype=np.int8)
_KEEP = (1 << _OF) - 1
SUSTAINED_WEIGHT = 0.2  # of a new report in a cell's mean z (about the last ten reports)
SUSTAINED_CLIP = 5.0  # a report's robust z is clipped to this before it is averaged
#: Reports a cell's offset must rest on before its means count. Ten reports (what the
#: three-of-five rule waits for) leave an offset a few per cent off now and then (just
#: after a relaunch), and a mean held over many reports would take that for a shift.
SUSTAINED_SETTLE = 30


@dataclass(frozen=True)
class Comparison:
    """One step's comparison, in slot order (rows are slots, columns features)."""

    x: np.ndarray
    med: np.ndarray
    scale: np.ndarray
    new: np.ndarray  # newly confirmed outliers
    together: np.ndarray  # cells drifting out with them (for node and replica findings)


Gathered = tuple[np.ndarray, np.ndarray]
"""The watched features a step reports: the index of each among the step's columns and
among the watched features."""


def nanmedian_columns(x: np.ndarray, nan_seen: bool = False) -> np.ndarray:
    """The median of each column over its non-NaN values (NaN for a column without any):
    np.nanmedian's result, without its slow masked path for small arrays. ``nan_seen``
    says the caller knows a NaN is in the columns (or in columns taken with them)."""
    if not nan_seen and not np.isnan(x).any():
        return median_columns(x)  # np.median's numbers (a partition, not a sort)
    # The middle two of each column's values in sorted order (NaN sorts last), as a sort
    # finds them: a partition finds the same numbers, bit for bit, unless the column holds
    # a -0.0 (equal to 0.0: which of them a sort puts in the middle is its own affair), so
    # such a column is sorted.
    count = len(x) - np.count_nonzero(np.isnan(x), axis=0)
    negative_zero = (np.signbit(x) & (x == 0)).any(axis=0)
    low, high = np.full(x.shape[1], np.nan), np.full(x.shape[1], np.nan)
    for n in np.unique(count[count > 0]).tolist():
        plain = (count == n) & ~negative_zero
        if plain.any():
            low[plain], high[plain] = middle(x.T[plain].T, n)  # column-major, as x
        signed_zero = (count == n) & negative_zero
        if signed_zero.any():
            ordered = np.sort(x.T[signed_zero].T, axis=0)
            low[signed_zero], high[signed_zero] = ordered[(n - 1) // 2], ordered[n // 2]
    med: np.ndarray = np.where(count > 0, (low + high) / 2.0, np.nan)
    return med


def _enough(reported: np.ndarray, min_ranks: int) -> bool:
    """Whether at least ``min_ranks`` rows report a value (one column often says so)."""
    for i in range(reported.shape[1]):
        if np.count_nonzero(reported[:, i]) >= min_ranks:
            return True
    return int(reported.any(axis=1).sum()) >= min_ranks


def _column(cells: np.ndarray | None, i: int) -> np.ndarray | None:
    return None if cells is None else cells[:, i]


def _widen(cells: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Boolean cells of some features as the cells of all (False in the others)."""
    out = np.zeros(shape, dtype=bool)
    out[:, cols] = cells
    return out


class PeerCore:
    """State of the comparison: features (which may be added), offsets, persistence."""

    def __init__(
        self,
        z: float,
        persistence: int,
        clear: int,
        warmup: int,
        offset_alpha: float,
        sustained_z: float = 0.0,
    ) -> None:
        self.z, self.persistence, self.clear, self.warmup = z, persistence, clear, warmup
        self.sustained_z = sustained_z
        self._sustained = np.zeros(0, dtype=bool)  # features with the sustained bar
        self._means_ready = np.zeros(0, dtype=bool)  # every cell's offset known
        # Per cell, column-major: the weighted mean of its reports' z and of their
        # relative deviation (updated for the sustained features only).
        self._mean_z = np.zeros((0, 0), order="F")
        self._mean_dev = np.zeros((0, 0), order="F")
        self.names: list[str] = []
        self._sign = np.zeros(0)
        self._shift = np.zeros(0)
        self._abs = np.zeros(0)
        self._share = np.zeros(0)  # of the job's median step, in milliseconds
        self._step_ms = 0.0  # the job's median step time at the last step that had one
        self._votes = np.zeros(0, dtype=np.int8)
        self._net_of: list[str | None] = []
        self._persist = np.zeros(0, dtype=np.int32)
        self.layout = RankLayout()
        self.offsets = Offsets(np.zeros(0, dtype=bool), offset_alpha)
        self.count = np.zeros((0, 0), dtype=np.int32)
        self.normal = np.zeros((0, 0), dtype=np.int32)
        self.fired = np.zeros((0, 0), dtype=bool)
        self._bits = np.zeros((0, 0), dtype=np.uint8)  # which of the last reports beat it
        self._active = np.zeros(0, dtype=bool)  # slots with any state worth updating
        self._seen = np.zeros((0, 0), dtype=np.int8)  # reports so far, up to _OF
        self._seen_all = np.zeros(0, dtype=bool)  # features every slot has _OF reports of
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
        sustained: bool = False,
        step_share: float = 0.0,
        net_of: str | None = None,
    ) -> None:
        """Watches one more feature (``sign`` +1 high is bad, -1 low is bad, 0 either);
        ``votes`` of its last five reports must beat the bar (a clean flag needs one);
        ``sustained``: a mean z above ``sustained_z`` beats it too; ``step_share``: a
        deviation (in milliseconds) must also be that share of the job's median step;
        ``net_of``: another feature, in the same unit, whose deficit under its peers' median
        is taken from each rank's value before it is compared (direction +1)."""
        self.names.append(name)
        self._net_of.append(net_of)
        self._share = np.append(self._share, step_share)
        self._sustained = np.append(self._sustained, sustained and self.sustained_z > 0)
        self._means_ready = np.append(self._means_ready, False)
        self._votes = np.append(self._votes, np.int8(min(max(votes, 1), _OF)))
        self._persist = np.append(self._persist, persistence or self.persistence)
        self._sign = np.append(self._sign, float(sign))
        self._shift = np.append(self._shift, shift)
        self._abs = np.append(self._abs, min_abs)
        pad = ((0, 0), (0, 1))
        self.count, self.normal = np.pad(self.count, pad), np.pad(self.normal, pad)
        self.fired = np.pad(self.fired, pad)
        self._bits, self._seen = np.pad(self._bits, pad), np.pad(self._seen, pad)
        self._seen_all = np.append(self._seen_all, False)
        self._mean_z = np.asfortranarray(np.pad(self._mean_z, pad))
        self._mean_dev = np.asfortranarray(np.pad(self._mean_dev, pad))
        self.offsets.add(offset)

    def compare(self, batch: StepBatch, raw: Gathered, min_ranks: int) -> Comparison | None:
        """Updates persistence with one step's ``raw`` values (rows of ``batch``); the
        comparison when a cell is newly confirmed, else None.

        Only the features the step reports are computed over every rank, a column at a
        time: the others have no report to compare, learn from or count (their cells keep
        their state).
        """
        source, cols = raw
        values = column_major(batch.values)  # as the edge hands it, or copied so
        slots = self.layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
        size = len(self.layout.ranks)
        self._grow(size)
        warming = None
        if "since_launch" in batch.features:  # warming ranks take no part
            warming = to_slots(batch.column("since_launch"), slots, size) < self.warmup
            self.offsets.forget(warming)  # a relaunched rank may hold memory differently
            if warming.any():
                self._means_ready[:] = False
        # x: the values with each rank's learnt offset divided out; reported: where the
        # values themselves are finite.
        x = np.empty((size, len(cols)), order="F")
        reported = np.empty(x.shape, dtype=bool, order="F")
        for i, (c, j) in enumerate(zip(source.tolist(), cols.tolist(), strict=True)):
            column = to_slots(values[:, c], slots, size)
            if warming is not None:
                column = np.where(warming, np.nan, column)
            np.isfinite(column, out=reported[:, i])
            self.offsets.divide(column, j, x[:, i])
        if not _enough(reported, min_ranks):
            return None
        self._net_of_deficits(x, raw, values, slots, warming)
        med, scale = self._peer_stats(x, len(cols) < len(self.names))
        floor = np.maximum(self._shift[cols] * np.abs(med), self._abs[cols])
        share = self._share[cols]
        if share.any():  # an excess that costs a sliver of the step is no finding
            floor = np.maximum(floor, share * self._median_step_ms(batch))
        bar = np.maximum(self.z * scale, floor)
        beats = self._beats(x, med, bar, cols)
        learning = self.offsets.learning()  # offsets not known yet: learn, do not judge
        learning_here = None if learning is None else pick_columns(learning, cols)
        if learning_here is not None:
            beats &= ~learning_here
        drift = self._sustained_means(x, med, scale, floor, cols, beats)
        drifting, departing = (None, None) if drift is None else drift
        self._calls += 1
        if size <= _SAMPLE or self._calls % 4 == 0:  # at scale, offsets learn every 4th
            for i, j in enumerate(cols.tolist()):
                if self.offsets.learns(j, float(med[i])):
                    signed = x[:, i] - med[i]
                    calm = self._calm(signed, bar[i], _column(learning_here, i))
                    self.offsets.learn(j, x[:, i], med[i], calm, _column(drifting, i))
        self._count_reports(reported, cols)
        # Only ranks out now or with state (recent reports beyond the bar, a count, a
        # fired finding) need the rest; at 100k ranks they are a handful.
        rows = np.flatnonzero(beats.any(axis=1) | self._active)
        if not len(rows):
            return None
        width = (len(rows), len(self.names))
        signed_rows = np.full(width, np.nan)
        signed_rows[:, cols] = x[rows] - med
        bar_all = np.full(len(self.names), np.nan)
        bar_all[cols] = bar
        calm = self._calm(signed_rows, bar_all, None if learning is None else learning[rows])
        if departing is not None:  # not well inside while its means head for the bar
            calm &= ~_widen(departing[rows], cols, width)
        new_rows = self._update(
            rows, _widen(beats[rows], cols, width), _widen(reported[rows], cols, width), calm
        )
        if not new_rows.any():
            return None
        new = np.zeros((size, len(self.names)), dtype=bool)
        new[rows] = new_rows
        # A node's other ranks count as going out with it when they are out too, beat the
        # bar now or drift out on average: noise alone must not make one rank's fault its
        # node's.
        together = (self.count > 0) | _widen(beats, cols, new.shape)
        if departing is not None:
            together |= _widen(departing, cols, new.shape)
        x_all = np.full(new.shape, np.nan)
        x_all[:, cols] = x
        med_all, scale_all = np.full(len(self.names), np.nan), np.full(len(self.names), np.nan)
        med_all[cols], scale_all[cols] = med, scale
        return Comparison(x_all, med_all, scale_all, new, together)

    def _beats(
        self, x: np.ndarray, med: np.ndarray, bar: np.ndarray, cols: np.ndarray
    ) -> np.ndarray:
        """Cells whose deviation from the median in their feature's direction beats the
        bar: ``(x - med) * sign > bar``, or ``|x - med| > bar`` without a direction, a
        column at a time (for a sign of -1, ``-signed > bar`` is ``signed < -bar``,
        exactly)."""
        beats = np.empty(x.shape, dtype=bool, order="F")
        signed = np.empty(len(x))
        with np.errstate(invalid="ignore"):
            for i, sign in enumerate(self._sign[cols].tolist()):
                out = beats[:, i]
                np.subtract(x[:, i], med[i], out=signed)
                if sign == 1.0:
                    np.greater(signed, bar[i], out=out)
                elif sign == -1.0:
                    np.less(signed, -bar[i], out=out)
                elif sign == 0.0:
                    np.greater(np.abs(signed), bar[i], out=out)
                else:
                    np.greater(signed * sign, bar[i], out=out)
        return beats

    def _net_of_deficits(
        self,
        x: np.ndarray,
        raw: Gathered,
        values: np.ndarray,
        slots: np.ndarray | None,
        warming: np.ndarray | None,
    ) -> None:
        """The features judged net of another (``net_of``), less each rank's deficit in
        the other under its peers' median: a faster GPU waits longer in every all-reduce
        for the slower ones, by what it saved, and that wait is no slow link. A rank that
        does not report the other keeps its value."""
        source, cols = raw
        at = {j: i for i, j in enumerate(cols.tolist())}
        for i, j in enumerate(cols.tolist()):
            other = self._net_of[j]
            k = at.get(self.names.index(other)) if other in self.names else None
            if k is None:
                continue
            own = to_slots(values[:, source[k]], slots, len(x))
            if warming is not None:
                own = np.where(warming, np.nan, own)
            sample = own if len(own) <= _SAMPLE else own[self._sample_rows(len(own))]
            typical = float(nanmedian_columns(sample[:, None])[0])
            if np.isnan(typical):
                continue
            deficit = typical - own  # own may be the step's own column: not written
            np.maximum(deficit, 0.0, out=deficit)
            x[:, i] -= np.nan_to_num(deficit, copy=False)

    def _sustained_means(
        self,
        x: np.ndarray,
        med: np.ndarray,
        scale: np.ndarray,
        floor: np.ndarray,
        cols: np.ndarray,
        beats: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Updates the mean z and mean deviation of the sustained features' cells with
        this report and marks in ``beats`` the cells whose means beat the sustained bar.
        Returns the drifting cells (mean z above half that bar) and, among them, those
        departing (mean shift above half the floor too); None when no feature here is
        sustained."""
        here = np.flatnonzero(self._sustained[cols])
        if not len(here):
            return None
        drifting = np.zeros(x.shape, dtype=bool, order="F")
        departing = np.zeros(x.shape, dtype=bool, order="F")
        sz, w = self.sustained_z, SUSTAINED_WEIGHT
        with np.errstate(invalid="ignore", divide="ignore"):
            for i in here.tolist():
                j, sign = int(cols[i]), float(self._sign[cols[i]])
                dev = np.subtract(x[:, i], med[i])
                if sign == -1.0:
                    np.negative(dev, out=dev)
                elif sign == 0.0:
                    np.abs(dev, out=dev)
                elif sign != 1.0:
                    dev *= sign
                size = abs(float(med[i]))
                z = np.divide(dev, scale[i])
                np.clip(z, -SUSTAINED_CLIP, SUSTAINED_CLIP, out=z)
                mean_z, mean_dev = self._mean_z[:, j], self._mean_dev[:, j]
                seen = self._fresh_cells(j)  # None: every cell's offset is known
                if seen is not None:
                    mean_z[seen], mean_dev[seen] = 0.0, 0.0  # its means start afresh
                    np.logical_not(seen, out=seen)
                if seen is None and not np.isnan(z).any():  # every cell, in place
                    z -= mean_z
                    z *= w
                    mean_z += z
                    if size > 0:  # no size, no relative shift
                        dev /= size
                        dev -= mean_dev
                        dev *= w
                        mean_dev += dev
                    seen_now = None
                else:
                    seen_now = np.isfinite(z) if seen is None else seen & np.isfinite(z)
                    mean_z += np.where(seen_now, w * (z - mean_z), 0.0)
                    if size > 0:
                        mean_dev += np.where(seen_now, w * (dev / size - mean_dev), 0.0)
                np.greater(mean_z, 0.5 * sz, out=drifting[:, i])
                rows = np.flatnonzero(drifting[:, i])  # a handful: the rest stay False
                if not len(rows):
                    continue
                shift = mean_dev[rows] * size
                departing[rows, i] = shift > 0.5 * floor[i]
                held = (mean_z[rows] > sz) & (shift > floor[i])
                if seen_now is not None:
                    held &= seen_now[rows]
                beats[rows[held], i] = True
        return drifting, departing

    def _fresh_cells(self, j: int) -> np.ndarray | None:
        """Cells of feature ``j`` whose offset rests on fewer than ``SUSTAINED_SETTLE``
        reports (a new mask), None when there are none (remembered until a relaunch)."""
        if self._means_ready[j]:
            return None
        fresh = self.offsets.count[:, j] < SUSTAINED_SETTLE
        if fresh.any():
            return fresh
        self._means_ready[j] = True
        return None

    def _count_reports(self, reported: np.ndarray, cols: np.ndarray) -> None:
        """Reports so far per cell, up to five (a feature no rank lacks any more is done)."""
        todo = ~self._seen_all[cols]
        if not todo.any():
            return
        cols, reported = cols[todo], reported[:, todo]
        seen = np.minimum(self._seen[:, cols] + reported, _OF).astype(np.int8)
        self._seen[:, cols] = seen
        self._seen_all[cols] = (seen == _OF).all(axis=0)

    @staticmethod
    def _calm(
        signed: np.ndarray, bar: np.ndarray | float, learning: np.ndarray | None
    ) -> np.ndarray:
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

    def gather(self, batch: StepBatch) -> Gathered | None:
        """Which watched features the batch reports (see ``Gathered``); None for none."""
        have = [j for j, f in enumerate(self.names) if f in batch.features]
        if not have:
            return None
        source = [batch.features.index(self.names[j]) for j in have]
        return np.array(source, dtype=np.intp), np.array(have, dtype=np.intp)

    def _median_step_ms(self, batch: StepBatch) -> float:
        """The job's median step time in milliseconds (the batch's, worked out once for
        every detector that asks); an observation without step times (GPU scrapes) keeps
        the last one."""
        step_s = batch.job_median("step_time")
        if step_s is not None:
            self._step_ms = 1000.0 * step_s
        return self._step_ms

    def _peer_stats(self, x: np.ndarray, nan_seen: bool) -> tuple[np.ndarray, np.ndarray]:
        """Median and MAD-based scale per feature, from a sample of ranks at large scale."""
        sample = x
        if len(x) > _SAMPLE:
            sample = x.T[:, self._sample_rows(len(x))].T  # column-major, as x
        med = nanmedian_columns(sample, nan_seen)
        mad = nanmedian_columns(np.abs(sample - med), nan_seen)
        return med, np.maximum(1.4826 * mad, 1e-3 * np.abs(med) + 1e-12)

    def _sample_rows(self, n: int) -> np.ndarray:
        """The ranks the peer statistics of ``n`` ranks are taken from (above ``_SAMPLE``):
        a fixed random subset per layout, as drawing anew each step costs a shuffle."""
        if self._sample is None or self._sample_n != n:
            self._sample_n = n
            self._sample = np.sort(self._rng.choice(n, _SAMPLE, replace=False))
        return self._sample

    def _grow(self, size: int) -> None:
        extra = size - len(self.count)
        if extra > 0:
            pad = ((0, extra), (0, 0))
            self.count, self.normal = np.pad(self.count, pad), np.pad(self.normal, pad)
            self.fired = np.pad(self.fired, pad)
            self._bits, self._seen = np.pad(self._bits, pad), np.pad(self._seen, pad)
            self._active = np.pad(self._active, (0, extra))
            self._mean_z = np.asfortranarray(np.pad(self._mean_z, pad))
            self._mean_dev = np.asfortranarray(np.pad(self._mean_dev, pad))
            self._means_ready[:] = False
            self._seen_all[:] = False
            self.offsets.grow(size)
