"""ARTime with a discord confirmation, joined by a new-extreme trigger, for the NAB protocol.

A measured design (docs/benchmarks.md, "NAB: ARTime with a discord confirmation and a
new-extreme trigger, held out"). ARTime's detections (file range, a rest of its blocks,
kept by a rule of nab_artime_confirm.py: the discord rule, or none) united with the
new-extreme trigger of nab_extreme.py (a value beyond the range of every earlier value
by more than ``margin`` times that range; at most one a quarter probation). The union
keeps ARTime's rest: a flag of either within the rest after the last flag kept is
dropped (one event found by both is one detection), and nothing longer (a quarter
probation, as nab_families.combine holds, would hide true detections behind false ones).
The trigger's margin (or off) is one more constant the leave-one-category-out protocol
chooses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from detectors.eval.nab import probation_length
from detectors.eval.nab_artime_confirm import DISCORD_RULES, ArtimeConfirmFamily
from detectors.eval.nab_artime_rest import rest_flags, rest_rows
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_extreme import new_extreme_flags

Setting = tuple[float, ...]

#: Margins of the new-extreme trigger, in fractions of the earlier range (inf: off).
MARGINS: tuple[float, ...] = (math.inf, 0.02, 0.05, 0.1)


class ArtimeExtremeFamily:
    """A setting is (ARTime's four constants, rest, rule kind, a, b, margin): the
    confirmed ARTime's flags or the new-extreme trigger's, within one rest."""

    name = "artime_discord_extreme"

    def __init__(
        self,
        rules: Sequence[tuple[float, float, float]] = DISCORD_RULES,
        margins: Sequence[float] = MARGINS,
    ) -> None:
        self.confirmed = ArtimeConfirmFamily(rules=rules)
        self.margins = tuple(margins)
        self._extreme: dict[tuple[str, float], np.ndarray] = {}
        #: The shipped detector: ARTime with a rest of 8 blocks, no rule, no trigger.
        self.shipped: Setting = (*self.confirmed.shipped, math.inf)

    def settings(self) -> Iterable[Setting]:
        return [(*s, m) for s in self.confirmed.settings() for m in self.margins]

    def extreme(self, f: NabFile, margin: float) -> np.ndarray:
        """The new-extreme trigger's flags on ``f``, computed once per margin."""
        key = (f.name, margin)
        if key not in self._extreme:
            self._extreme[key] = new_extreme_flags(
                f.values, probation_length(len(f.values)), margin
            )
        return self._extreme[key]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        *confirmed, margin = setting
        rest = confirmed[4]
        art = self.confirmed.flags(files, tuple(confirmed))
        return [
            rest_flags(a | self.extreme(f, margin), rest_rows(rest, probation_length(len(a))))
            for a, f in zip(art, files, strict=True)
        ]
