"""A step detector whose findings count only while the job's own timings are quiet.

A live run's bars must suit the host it runs on. On GPUs a rank's compute time keeps
within a few per cent of its usual share of the step, and the precise peer comparison
(a 10 % slower rank, a NIC's collective time, a slow leak) is sound there; on a shared CPU
host the same times jump by half or more from one step to the next, and only coarse bars
stay quiet. ``QuietJob`` runs an inner step detector on every step (it keeps learning) and
passes its findings on only while the job has been measured quiet. When a measure opens
the gate, the findings withheld in the steps it covered pass too: a fault that began
before the first measure (a job's first 40 steps) would otherwise never be reported, as the
inner detector fires once per fault.

The measure: each step, every rank's ``feature`` (compute time by default) divided by the
median of the ranks not warming up; per rank, over the last ``window`` steps, the 90th
percentile of how far that ratio strays from its own median; the job's noise is the
median of those over the ranks. A rank's fixed offset and a lasting shift (a slow node
from some step on) move its ratio, not its spread about its own median, and one faulty
rank does not move the median over ranks; a host whose ranks all jitter does.

>>> quiet = QuietJob(window=8, warmup=0, max_noise=0.1)
>>> quiet.noise is None  # nothing measured yet: closed
True
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from collector.vocabulary import canonical_name
from detectors._buffer import Stepwise
from detectors._layout import RankLayout
from detectors.errors import DetectorError
from detectors.stepbatch import StepBatch
from detectors.types import Finding

_QUANTILE = 0.9  # of a rank's deviations over the window
#: The default bar of a quiet job. Measured (the median rank's 90th percentile over 20
#: steps): generated traces of GPU jobs, four generators, 0.013 to 0.037; healthy CPU runs
#: of the reference workload (4 ranks on a 2-core host) 0.23 to 0.86.
QUIET_NOISE = 0.1
QUIET_SUFFIX = "/quiet"  # after the inner detector's name, in a finding's ``detector``
_MIN_RANKS = 4  # ranks a step needs to give every rank a peer median
_WITHHELD = 1024  # findings kept while the gate is closed, for when it opens


class QuietJob(Stepwise):
    """Runs ``detector`` (a registered step detector, with ``params``) on every step and
    passes its findings on only while the job's noise is at most ``max_noise``.

    Args:
        detector: registry name of the inner detector; it must take whole steps.
        params: its keyword parameters.
        feature: the per-rank timing whose spread is measured (canonical name or alias).
        max_noise: the largest noise (a relative spread) at which findings pass.
        window: steps the measure looks back over.
        warmup: steps after a rank's (re)launch that it is left out of the measure.
        every: steps between two measurements (the measure costs a sort of the window).
        max_ranks: ranks measured at most (the first seen): the median over them is the
            job's noise to a per cent or two at any size.
    """

    name = "when_quiet"

    def __init__(
        self,
        detector: str = "peer_outlier",
        params: Mapping[str, Any] | None = None,
        feature: str = "compute_ms",
        max_noise: float = QUIET_NOISE,
        window: int = 20,
        warmup: int = 20,
        every: int = 5,
        max_ranks: int = 1024,
    ) -> None:
        if not max_noise > 0:
            raise DetectorError(f"max_noise must be above 0, got {max_noise!r}")
        if window < 4 or every < 1 or max_ranks < _MIN_RANKS:
            raise DetectorError(
                f"window must be at least 4, every at least 1 and max_ranks at least "
                f"{_MIN_RANKS}; got {window}, {every}, {max_ranks}"
            )
        from detectors.registry import create  # the registry registers this class

        self.inner = create(detector, params)
        if getattr(self.inner, "process_step", None) is None:
            raise DetectorError(f"{detector!r} does not take whole steps; when_quiet needs one")
        self.feature = canonical_name(feature)
        self.max_noise, self.window, self.warmup, self.every = max_noise, window, warmup, every
        self.noise: float | None = None  # the last measure; None: not measured yet
        self._layout = RankLayout()  # each rank's column of the window, in order seen
        self._ratios = np.full((window, max_ranks), np.nan)
        self._filled = 0  # steps written into the window
        self.dropped = 0  # findings withheld while the job was noisy
        # (steps written when withheld, finding): the latest, for when the gate opens
        self._withheld: deque[tuple[int, Finding]] = deque(maxlen=_WITHHELD)

    @property
    def quiet(self) -> bool:
        return self.noise is not None and self.noise <= self.max_noise

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        found: Sequence[Finding] = self.inner.process_step(batch)  # type: ignore[attr-defined]
        was_quiet = self.quiet
        self._measure(batch)
        if not self.quiet:
            self.dropped += len(found)
            self._withheld.extend((self._filled, f) for f in found)
            return ()
        if not was_quiet and self._withheld:
            found = [*self._measured_quiet(), *found]
        # Named apart from the same detector run outside the gate (fusion keeps one finding
        # of a fault that two detectors' bars catch at different steps).
        return [replace(f, detector=f"{f.detector}{QUIET_SUFFIX}") for f in found]

    def _measured_quiet(self) -> list[Finding]:
        """The gate opens: the findings withheld in the steps its measure covered, which
        it found quiet (a fault that began before the first measure: the inner detector
        fires once and would not again); older ones stay withheld, and all are forgotten."""
        since = self._filled - self.window
        passed = [f for at, f in self._withheld if at > since]
        self._withheld.clear()
        self.dropped -= len(passed)
        return passed

    def _measure(self, batch: StepBatch) -> None:
        if self.feature not in batch.features:
            return
        values = batch.column(self.feature)
        if "since_launch" in batch.features:
            values = np.where(batch.column("since_launch") >= self.warmup, values, np.nan)
        finite = np.isfinite(values) & (values > 0)
        if np.count_nonzero(finite) < _MIN_RANKS:
            return
        slots = self._layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
        if slots is None:  # rows are slots
            slots = np.arange(len(batch.ranks))
        kept = finite & (slots < self._ratios.shape[1])
        row = self._ratios[self._filled % self.window]
        row[:] = np.nan
        row[slots[kept]] = values[kept] / np.median(values[finite])
        self._filled += 1
        if self._filled >= self.window and self._filled % self.every == 0:
            self.noise = self._spread()

    def _spread(self) -> float | None:
        ratios = self._ratios[:, : len(self._layout.ranks)]
        counted = np.count_nonzero(np.isfinite(ratios), axis=0) >= self.window // 2
        if np.count_nonzero(counted) < _MIN_RANKS:
            return None
        ratios = ratios[:, counted]
        own = np.nanmedian(ratios, axis=0)
        spread = np.nanquantile(np.abs(ratios / own - 1.0), _QUANTILE, axis=0)
        return float(np.median(spread))
