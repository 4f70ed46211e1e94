"""A new-extreme trigger beside the record detector, for the NAB protocol.

A measured design, not a shipped detector (docs/benchmarks.md, "NAB: a new-extreme
trigger"). Two of the AWS CloudWatch windows the record detector misses hold a value
above every value of the file before it (grok_asg_anomaly's 45.6 over 39.9,
ec2_network_in_5abac7's 8.3e6 over 6.5e6), and the record detector does not flag them:
its novelty term is small against the record of four probations a candidate must beat.
Numenta HTM flags both (an unseen value is an unpredicted one). The trigger: a point is
an anomaly when it leaves the range of every earlier value by more than ``margin`` times
that range; at most one a quarter probation, none in the probation. ``ExtremeRecordFamily``
joins it to the record detector (either fires: OR) over the record grid, ``margin`` (or
off) one more constant chosen by the protocol.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_families import EITHER, RecordFamily, combine

Setting = tuple[float, ...]

#: Margins tried, in fractions of the earlier range (inf: the trigger off).
MARGINS: tuple[float, ...] = (math.inf, 0.02, 0.05, 0.1, 0.2)


def new_extreme_flags(values: np.ndarray, probation: int, margin: float) -> np.ndarray:
    """Points beyond the range of every earlier value by more than ``margin`` times that
    range, at most one a quarter probation, none in the probation."""
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)):
        raise DetectorError("the new-extreme trigger needs finite values; drop or fill NaN rows")
    if margin < 0:
        raise DetectorError(f"margin must be 0 or more (a fraction of the range), got {margin}")
    flags = np.zeros(len(x), dtype=bool)
    if len(x) < 2 or math.isinf(margin):
        return flags
    high = np.maximum.accumulate(x)[:-1]
    low = np.minimum.accumulate(x)[:-1]
    span = high - low
    beyond = (x[1:] > high + margin * span) | (x[1:] < low - margin * span)
    suppress = max(probation // 4, 1)
    last = -(10**9)
    for i in np.flatnonzero(beyond) + 1:
        if i < probation or i - last <= suppress:
            continue
        flags[i] = True
        last = int(i)
    return flags


class ExtremeRecordFamily:
    """The record detector's grid, each setting with the new-extreme trigger off or at a
    margin: a setting is (margin, the record grid's seven constants)."""

    name = "extreme_record"

    def __init__(self, margins: Sequence[float] = MARGINS) -> None:
        self.margins = tuple(margins)
        self.record = RecordFamily()

    def settings(self) -> Iterable[Setting]:
        return [(m, *r) for r, m in itertools.product(self.record.settings(), self.margins)]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        margin, record = setting[0], setting[1:]
        out = []
        for f, a in zip(files, self.record.flags(files, record), strict=True):
            probation = probation_length(len(f.values))
            b = new_extreme_flags(f.values, probation, margin)
            out.append(combine(a, b, EITHER, probation) if b.any() else a)
        return out
