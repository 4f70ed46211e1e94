"""One step of every rank as arrays: the shape the vectorised detectors work on.

At 100k ranks a Python call per rank per step is too slow, so detectors that compare peers
take a whole step at once. ``StepBatch`` is built from Frames (``from_frames``) or straight
from arrays (a trace, a Prometheus query); ``frames()`` turns it back into Frames for the
detectors that only speak the per-frame protocol.

>>> from collector.types import Frame, Subject
>>> fr = [Frame(Subject(0, r, f"n{r // 2}"), 5, 1.0, {"step_time": 1.0 + r}) for r in range(4)]
>>> b = StepBatch.from_frames(fr)
>>> b.column("step_time").tolist(), b.nodes.tolist()
([1.0, 2.0, 3.0, 4.0], ['n0', 'n0', 'n1', 'n1'])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from collector.types import Frame, Subject
from detectors._median import median

_BLOCK = 256  # rows copied at a time into column order: a block stays in the L1 cache


def column_major(array: np.ndarray) -> np.ndarray:
    """A copy of a 2-D array in column-major (Fortran) order, the array itself when it is
    already; copied a block of rows at a time, several times faster than a plain transpose
    copy of a tall array."""
    if array.flags.f_contiguous:
        return array
    out = np.empty(array.shape, dtype=array.dtype, order="F")
    for start in range(0, len(array), _BLOCK):
        out[start : start + _BLOCK] = array[start : start + _BLOCK]
    return out


@dataclass(frozen=True, eq=False)
class StepBatch:
    """Features of ``len(ranks)`` ranks at one step; missing values are NaN.

    Attributes:
        step: the training step.
        time: the step's wall time (seconds), the latest of its frames.
        ranks: int array, one per row.
        nodes: str array, one per row.
        replicas: int array, one per row.
        features: the column names of ``values``.
        values: float array of shape (len(ranks), len(features)); NaN where not reported.
        present: bool array of the same shape, False where a rank did not report a feature.
            It tells a missing value from a reported NaN (a NaN loss is a fault, a missing
            loss is not); None means every non-NaN value is present and NaN is missing.
    """

    step: int
    time: float
    ranks: np.ndarray
    nodes: np.ndarray
    replicas: np.ndarray
    features: tuple[str, ...]
    values: np.ndarray
    present: np.ndarray | None = None
    _medians: dict[str, float | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.values.shape != (len(self.ranks), len(self.features)):
            raise ValueError(
                f"values has shape {self.values.shape}, expected "
                f"({len(self.ranks)}, {len(self.features)}): one row per rank, one column "
                "per feature"
            )

    def column(self, feature: str) -> np.ndarray:
        """The feature's values, or all-NaN when the step does not carry it."""
        try:
            column: np.ndarray = self.values[:, self.features.index(feature)]
        except ValueError:
            return np.full(len(self.ranks), np.nan)
        return column

    def job_median(self, feature: str) -> float | None:
        """The median of the feature over the ranks' finite values (None without any):
        its job-wide value at this step. Worked out once per batch, however many
        detectors ask (a batch is not changed once built)."""
        if feature not in self._medians:
            col = self.column(feature)
            finite = col[np.isfinite(col)]
            self._medians[feature] = median(finite) if len(finite) else None
        return self._medians[feature]

    def reported(self, feature: str) -> np.ndarray:
        """Bool mask of the ranks that reported the feature (NaN included when reported)."""
        if feature not in self.features:
            return np.zeros(len(self.ranks), dtype=bool)
        col = self.features.index(feature)
        mask: np.ndarray = (
            ~np.isnan(self.values[:, col]) if self.present is None else self.present[:, col]
        )
        return mask

    def column_major(self) -> StepBatch:
        """The same batch with ``values`` and ``present`` stored column by column (itself
        when they are already): a feature's column is then one contiguous read, which is
        how the vectorised detectors read a step."""
        present = self.present
        if self.values.flags.f_contiguous and (present is None or present.flags.f_contiguous):
            return self
        return replace(
            self,
            values=column_major(self.values),
            present=None if present is None else column_major(present),
        )

    def subject(self, row: int) -> Subject:
        return Subject(int(self.replicas[row]), int(self.ranks[row]), str(self.nodes[row]))

    def frames(self, reported_only: bool = False) -> Iterator[Frame]:
        """One Frame per rank, without the NaN (missing) features; with ``reported_only``,
        only the ranks that reported something (a scrape of one node's GPUs, a step report
        of a few ranks, among thousands of silent rows)."""
        mask = ~np.isnan(self.values) if self.present is None else self.present
        rows = np.flatnonzero(mask.any(axis=1)) if reported_only else range(len(self.ranks))
        for row in rows:
            values = {
                f: float(v)
                for f, v, ok in zip(self.features, self.values[row], mask[row], strict=True)
                if ok
            }
            yield Frame(self.subject(int(row)), self.step, self.time, values)

    @classmethod
    def from_frames(cls, frames: Sequence[Frame]) -> StepBatch:
        """Stacks frames of one step (rank-scoped subjects); the last frame of a rank wins."""
        features = tuple(sorted({k for f in frames for k in f.values}))
        index = {name: i for i, name in enumerate(features)}
        by_rank: dict[int, Frame] = {}
        for frame in frames:
            by_rank[frame.subject.rank if frame.subject.rank is not None else -1] = frame
        rows = list(by_rank.values())
        values = np.full((len(rows), len(features)), np.nan)
        present = np.zeros(values.shape, dtype=bool)
        for r, frame in enumerate(rows):
            for k, v in frame.values.items():
                values[r, index[k]] = v
                present[r, index[k]] = True
        return cls(
            step=max((f.step or 0) for f in rows) if rows else 0,
            time=max((f.time for f in rows), default=0.0),
            ranks=np.array([f.subject.rank if f.subject.rank is not None else -1 for f in rows]),
            nodes=np.array([f.subject.node or "" for f in rows], dtype=object),
            replicas=np.array([f.subject.replica or 0 for f in rows]),
            features=features,
            values=values,
            present=present,
        )
