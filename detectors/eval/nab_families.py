"""Detector families for the NAB leave-one-category-out protocol.

A family is a grid of settings and, for each setting, one boolean flag array per file
(the detector's own verdicts, no labels). ``RecordFamily`` is the shipped RecordDetector
over nab_loco's grid; ``CadFamily`` is CAD OSE (detectors/cad.py) with its threshold,
rest period and range margin as the constants; ``FusionFamily`` joins the two with a
combination rule that is itself a constant of the grid: the record detector alone, CAD
alone, either (OR) or both within a quarter probation (AND), so the protocol chooses the
rule on five categories like every other constant.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from detectors.cad import cad_scores, probation_range, rest_filter
from detectors.eval.nab import probation_length
from detectors.eval.nab_corpus import NabFile

Setting = tuple[float, ...]

#: CAD OSE's constants tried: score threshold, rest period in probations (NAB: 0.2), range
#: margin in probation spans (the probation's range widened by this much on each side).
CAD_GRID: dict[str, tuple[float, ...]] = {
    "threshold": (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9),
    "rest": (0.1, 0.2, 0.4),
    "margin": (0.0, 0.5, 1.0),
}
#: CAD's constants tried inside FusionFamily (a smaller grid: it multiplies the record
#: detector's 432 settings and the two joint rules).
FUSION_CAD_GRID: dict[str, tuple[float, ...]] = {
    "threshold": (0.7, 0.75, 0.8, 0.85),
    "rest": (0.1, 0.2),
    "margin": (0.0,),
}
#: Combination rules of FusionFamily.
RECORD, CAD, EITHER, BOTH = 0.0, 1.0, 2.0, 3.0


class Family(Protocol):
    name: str

    def settings(self) -> Iterable[Setting]: ...

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]: ...


def _bools(hits: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[hits] = True
    return out


class RecordFamily:
    """RecordDetector over nab_loco.GRID (read when called, so a variant may replace it)."""

    name = "record"

    def __init__(self) -> None:
        self._hits: dict[Setting, list[np.ndarray]] = {}

    def settings(self) -> Iterable[Setting]:
        from detectors.eval import nab_loco

        return list(nab_loco.settings())

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        from detectors.eval import nab_loco

        if setting not in self._hits:
            hits = []
            for f in files:
                probation = probation_length(len(f.values))
                det = nab_loco.detector_for(setting, probation)
                hits.append(np.flatnonzero(det.detect(f.values, probation).flags))
            self._hits[setting] = hits
        return [_bools(h, len(f.values)) for h, f in zip(self._hits[setting], files, strict=True)]


class CadFamily:
    """CAD OSE with a fixed threshold on its rest-filtered score (NAB's use of it)."""

    name = "cad"

    def __init__(self, grid: dict[str, tuple[float, ...]] | None = None) -> None:
        self.grid = grid or CAD_GRID
        self._raw: dict[tuple[str, float], np.ndarray] = {}

    def settings(self) -> Iterable[Setting]:
        return list(itertools.product(*self.grid.values()))

    def raw(self, f: NabFile, margin: float) -> np.ndarray:
        key = (f.name, margin)
        if key not in self._raw:
            probation = probation_length(len(f.values))
            low, high = probation_range(f.values, probation, margin)
            self._raw[key] = cad_scores(f.values, low, high)
        return self._raw[key]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        threshold, rest, margin = setting
        out = []
        for f in files:
            probation = probation_length(len(f.values))
            kept = rest_filter(self.raw(f, margin), 0.75, max(int(rest * probation), 1))
            out.append(kept >= threshold)
        return out


def combine(a: np.ndarray, b: np.ndarray, rule: float, probation: int) -> np.ndarray:
    """Two detectors' flags joined by ``rule``; at most one alarm per quarter probation.

    BOTH fires when one detector flags a point and the other flagged in the quarter
    probation before it (or at it): causal, confirmation by a second family.
    """
    span = max(probation // 4, 1)
    if rule == RECORD:
        return np.asarray(a, dtype=bool)
    if rule == CAD:
        return np.asarray(b, dtype=bool)
    if rule == EITHER:
        candidates = np.flatnonzero(a | b)
    else:
        ca, cb = np.cumsum(a), np.cumsum(b)

        def recent(c: np.ndarray, i: np.ndarray) -> np.ndarray:
            before = np.where(i - span - 1 >= 0, c[np.maximum(i - span - 1, 0)], 0)
            return np.asarray(c[i] - before > 0, dtype=bool)

        ia, ib = np.flatnonzero(a), np.flatnonzero(b)
        candidates = np.union1d(ia[recent(cb, ia)], ib[recent(ca, ib)])
    out = np.zeros(len(a), dtype=bool)
    last = -(10**9)
    for i in candidates:
        if i - last > span:
            out[i] = True
            last = int(i)
    return out


class FusionFamily:
    """RecordDetector and CAD OSE, the combination rule chosen by the protocol.

    A setting is (rule, CAD's three constants, the record grid's seven).
    """

    name = "fusion"

    def __init__(self, record: RecordFamily | None = None, cad: CadFamily | None = None):
        self.record = record or RecordFamily()
        self.cad = cad or CadFamily(FUSION_CAD_GRID)

    def settings(self) -> Iterable[Setting]:
        records, cads = list(self.record.settings()), list(self.cad.settings())
        out = [(RECORD, *cads[0], *r) for r in records]
        out += [(CAD, *c, *records[0]) for c in cads]
        for rule in (EITHER, BOTH):
            out += [(rule, *c, *r) for c in cads for r in records]
        return out

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        rule, cad_setting, record_setting = setting[0], setting[1:4], setting[4:]
        a = self.record.flags(files, record_setting)
        b = self.cad.flags(files, cad_setting)
        return [
            combine(x, y, rule, probation_length(len(f.values)))
            for x, y, f in zip(a, b, files, strict=True)
        ]
