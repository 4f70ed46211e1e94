"""ARTime joined with the record detector and the new-extreme trigger, for the NAB protocol.

A measured design (docs/benchmarks.md, "NAB: ARTime joined with the record detector").
ARTime (detectors/eval/nab_artime.py, scaled by the file's minimum and maximum as NAB
hands them to every detector) is joined to a partner by a rule that is itself a constant
of the grid, so the leave-one-category-out protocol chooses it on five categories like
every other constant: ARTime alone, either fires (OR), or both within a quarter
probation (AND, nab_families.combine). The partner is one of the record detector (over
nab_loco's grid), the new-extreme trigger alone (detectors/eval/nab_extreme.py) or the
two joined (either fires). ARTime keeps its published constants; its score threshold is
a constant of the grid.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import PUBLISHED, ArtimeFamily
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_extreme import new_extreme_flags
from detectors.eval.nab_families import BOTH, EITHER, RECORD, RecordFamily, combine

Setting = tuple[float, ...]

#: Rules: ARTime alone, either fires, both within a quarter probation.
ALONE = RECORD
RULES: tuple[float, ...] = (ALONE, EITHER, BOTH)
#: Partners: none (ARTime alone), the record detector, the new-extreme trigger, both of
#: them joined by OR.
NONE, RECORD_PARTNER, EXTREME, EXTREME_RECORD = 0.0, 1.0, 2.0, 3.0
#: ARTime's score thresholds tried (its published constants otherwise).
THRESHOLDS: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7)
#: New-extreme margins tried (fractions of the earlier range).
MARGINS: tuple[float, ...] = (0.05, 0.1)


class ArtimeFusionFamily:
    """ARTime (file range) with a partner, the rule chosen by the protocol.

    A setting is (rule, ARTime threshold, partner, extreme margin, the record grid's seven
    constants); fields a setting does not use hold the first value tried.
    """

    name = "artime_fusion"

    def __init__(
        self,
        thresholds: Sequence[float] = THRESHOLDS,
        margins: Sequence[float] = MARGINS,
        record: RecordFamily | None = None,
    ) -> None:
        self.thresholds = tuple(thresholds)
        self.margins = tuple(margins)
        self.record = record or RecordFamily()
        self.artime = ArtimeFamily()
        self._extreme: dict[tuple[str, float], np.ndarray] = {}

    def settings(self) -> Iterable[Setting]:
        records = list(self.record.settings())
        first, margin0 = records[0], self.margins[0]
        partners: list[tuple[float, ...]] = [(RECORD_PARTNER, margin0, *r) for r in records]
        partners += [(EXTREME, m, *first) for m in self.margins]
        partners += [(EXTREME_RECORD, m, *r) for m in self.margins for r in records]
        out: list[Setting] = [(ALONE, t, NONE, margin0, *first) for t in self.thresholds]
        for rule, t in itertools.product((EITHER, BOTH), self.thresholds):
            out += [(rule, t, *p) for p in partners]
        return out

    def extreme(self, f: NabFile, margin: float) -> np.ndarray:
        key = (f.name, margin)
        if key not in self._extreme:
            probation = probation_length(len(f.values))
            self._extreme[key] = new_extreme_flags(f.values, probation, margin)
        return self._extreme[key]

    def partner(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        kind, margin, record = setting[2], setting[3], setting[4:]
        if kind == EXTREME:
            return [self.extreme(f, margin) for f in files]
        a = self.record.flags(files, record)
        if kind == RECORD_PARTNER:
            return a
        return [
            combine(x, self.extreme(f, margin), EITHER, probation_length(len(f.values)))
            for x, f in zip(a, files, strict=True)
        ]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        rule, threshold = setting[0], setting[1]
        art = self.artime.flags(files, (*PUBLISHED[:3], threshold, 0.0))
        if rule == ALONE:
            return art
        return [
            combine(a, b, rule, probation_length(len(f.values)))
            for a, b, f in zip(art, self.partner(files, setting), files, strict=True)
        ]
