"""ARTime with a rest period after each kept detection, for the NAB protocol.

A measured design (docs/benchmarks.md, "NAB: ARTime with a rest period, held out").
ARTime (detectors/eval/nab_artime.py, scaled by the file's minimum and maximum as NAB
hands them to every detector) often founds two or three new clusters on one event a few
blocks apart: the event stays in its 8-block feature window for 8 blocks, and each new
shape of that window can be novel. Inside a labelled window the later detections earn
nothing; outside one each costs a false positive. A rest period drops every detection
that comes within ``rest`` of the last detection kept (a kept detection starts a new
rest; a dropped one does not). The rest is a constant of the grid beside ARTime's own
(``GRID``), so the leave-one-category-out protocol chooses it on five categories like
every other constant. Two units: ``block`` (ARTime's blocks: the rests tried are at most
its own mask after an anomaly, 1.5 feature windows) and ``probation`` (fractions of the
probation, up to half of it; a longer rest can hide a true detection behind a false one).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import GRID, PUBLISHED, ArtimeFamily, block_length
from detectors.eval.nab_corpus import NabFile

Setting = tuple[float, ...]

#: Rest periods tried per unit (0: every detection kept, ARTime alone).
RESTS: Mapping[str, tuple[float, ...]] = {
    "block": (0.0, 4.0, 8.0, 12.0),
    "probation": (0.0, 0.05, 0.1, 0.25, 0.5),
}


def rest_flags(flags: np.ndarray, rest: int) -> np.ndarray:
    """``flags`` less every flag within ``rest`` rows after the last flag kept."""
    out = np.zeros(len(flags), dtype=bool)
    last = -(10**9)
    for i in np.flatnonzero(flags):
        if i - last > rest:
            out[i] = True
            last = int(i)
    return out


def rest_rows(rest: float, probation: int, unit: str = "block") -> int:
    """A rest of ``rest`` units (ARTime blocks or probations) in rows, for a file of the
    given probation."""
    if unit == "block":
        return int(rest * block_length(probation))
    if unit == "probation":
        return int(rest * probation)
    raise DetectorError(f"rest unit must be one of {', '.join(RESTS)}, got {unit!r}")


class ArtimeRestFamily:
    """ARTime (file range) over ``GRID`` and the unit's rests: a setting is (initial_rho,
    chomp, lb_rise, threshold, rest); ARTime's scores of each (initial_rho, chomp, lb_rise)
    are computed once per file."""

    name = "artime_rest"

    def __init__(
        self,
        unit: str = "block",
        grid: dict[str, tuple[float, ...]] | None = None,
        rests: Sequence[float] | None = None,
    ) -> None:
        if unit not in RESTS:
            raise DetectorError(f"rest unit must be one of {', '.join(RESTS)}, got {unit!r}")
        self.unit = unit
        self.grid = grid or GRID
        self.rests = tuple(RESTS[unit] if rests is None else rests)
        self.artime = ArtimeFamily(self.grid)
        #: The published constants, every detection kept, no rest.
        self.published: Setting = (*PUBLISHED, 0.0)

    def settings(self) -> Iterable[Setting]:
        return list(itertools.product(*self.grid.values(), self.rests))

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        *constants, rest = setting
        art = self.artime.flags(files, (*constants, 0.0))
        return [
            rest_flags(a, rest_rows(rest, probation_length(len(f.values)), self.unit))
            for a, f in zip(art, files, strict=True)
        ]
