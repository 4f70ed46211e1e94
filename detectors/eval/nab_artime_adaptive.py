"""ARTime with a setting chosen per file from its own probation, for the NAB protocol.

A measured design (docs/benchmarks.md, "NAB: ARTime with a file-adaptive setting, held
out"). Most of the shipped ARTime's false positives on AWS CloudWatch sit in a few series
where spikes are ordinary. Before any row is scored, the file's probation (unlabelled, the
rows every NAB detector may learn from) gives one number, its ``spikiness``: the fraction
of probation points further than ``k`` robust spreads from the probation's median. A file
whose spikiness reaches ``cut`` is scored with a strict setting (a higher score threshold
and a longer rest); every other file with the shipped one (threshold 0.3, rest 8 blocks).
``k``, ``cut`` and the strict setting are constants of the grid, chosen by the
leave-one-category-out protocol like every other constant; ARTime's own constants are
held at the published ones.

The robust spread is 1.4826 times the median absolute deviation; where that is 0 (a series
resting on one value most of the time, common on AWS CloudWatch), 1.2533 times the mean
absolute deviation (the same spread for normal data); where that is 0 too (a flat
probation), the spikiness is 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import PUBLISHED, ArtimeFamily
from detectors.eval.nab_artime_rest import rest_flags, rest_rows
from detectors.eval.nab_corpus import NabFile

Setting = tuple[float, ...]

#: The shipped setting: score threshold and rest (ARTime's blocks).
DEFAULT_THRESHOLD, DEFAULT_REST = 0.3, 8.0
#: Characteristic kinds: 0 ``outliers`` (``spikiness``), 1 ``jump`` (``jump_ratio``).
KINDS = ("outliers", "jump")
#: Constants tried: robust spreads ``k`` and cut-offs of ``outliers``; cut-offs of
#: ``jump``; the strict threshold and rest.
KS = (3.0, 5.0, 8.0)
CUTS = (0.01, 0.02, 0.05, 0.1, 0.2)
JUMP_CUTS = (20.0, 50.0, 100.0, 200.0, 500.0)
STRICT_THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
STRICT_RESTS = (8.0, 16.0, 24.0)
#: A cut no file reaches: every file gets the shipped setting.
NEVER = float("inf")


def spikiness(probation_values: np.ndarray, k: float) -> float:
    """The fraction of ``probation_values`` further than ``k`` robust spreads from their
    median (0 for an empty or flat stretch)."""
    if k <= 0:
        raise DetectorError(f"k (robust spreads) must be positive, got {k!r}")
    h = np.asarray(probation_values, dtype=float)
    h = h[np.isfinite(h)]
    if len(h) == 0:
        return 0.0
    dev = np.abs(h - np.median(h))
    scale = 1.4826 * float(np.median(dev))
    if scale == 0.0:
        scale = 1.2533 * float(dev.mean())
    if scale == 0.0:
        return 0.0
    return float(np.mean(dev > k * scale))


def jump_ratio(probation_values: np.ndarray) -> float:
    """The largest absolute step of ``probation_values`` over their median absolute step
    (over the mean one where the median is 0; 0 for fewer than 2 points or a flat
    stretch)."""
    h = np.asarray(probation_values, dtype=float)
    steps = np.abs(np.diff(h[np.isfinite(h)]))
    if len(steps) == 0:
        return 0.0
    typical = float(np.median(steps)) or float(steps.mean())
    if typical == 0.0:
        return 0.0
    return float(steps.max()) / typical


def characteristic(probation_values: np.ndarray, kind: float, k: float) -> float:
    """The probation's characteristic of ``kind`` (``KINDS``; ``k`` for ``outliers``)."""
    if kind == 0.0:
        return spikiness(probation_values, k)
    if kind == 1.0:
        return jump_ratio(probation_values)
    raise DetectorError(f"characteristic kind must be 0 to {len(KINDS) - 1}, got {kind!r}")


def choose(
    probation_values: np.ndarray,
    kind: float,
    k: float,
    cut: float,
    strict: tuple[float, float],
) -> tuple[float, float]:
    """(threshold, rest) for a file: ``strict`` when its probation's characteristic
    reaches ``cut``, else the shipped (0.3, 8)."""
    if characteristic(probation_values, kind, k) >= cut:
        return strict
    return DEFAULT_THRESHOLD, DEFAULT_REST


def adaptive_flags(scores: np.ndarray, probation: int, threshold: float, rest: float) -> np.ndarray:
    """ARTime's detections (score > 0 and at least ``threshold``) less those within
    ``rest`` blocks after the last one kept."""
    s = np.asarray(scores, dtype=float)
    return rest_flags((s > 0) & (s >= threshold), rest_rows(rest, probation))


class ArtimeAdaptiveFamily:
    """ARTime (published constants, file range) with a per-file setting: a setting is
    (kind, k, cut, strict threshold, strict rest); (0, k, ``NEVER``, 0.3, 8) is the shipped
    detector."""

    name = "artime_adaptive"

    def __init__(
        self,
        ks: Sequence[float] = KS,
        cuts: Sequence[float] = CUTS,
        jump_cuts: Sequence[float] = JUMP_CUTS,
        thresholds: Sequence[float] = STRICT_THRESHOLDS,
        rests: Sequence[float] = STRICT_RESTS,
    ) -> None:
        self.ks, self.cuts, self.jump_cuts = tuple(ks), tuple(cuts), tuple(jump_cuts)
        self.thresholds, self.rests = tuple(thresholds), tuple(rests)
        self.artime = ArtimeFamily()
        self.shipped: Setting = (0.0, self.ks[0], NEVER, DEFAULT_THRESHOLD, DEFAULT_REST)

    def settings(self) -> Iterable[Setting]:
        rules = [(0.0, k, c) for k, c in itertools.product(self.ks, self.cuts)]
        rules += [(1.0, 0.0, c) for c in self.jump_cuts]
        strict = [
            (*rule, t, r)
            for rule, t, r in itertools.product(rules, self.thresholds, self.rests)
            if (t, r) != (DEFAULT_THRESHOLD, DEFAULT_REST)
        ]
        return [self.shipped, *strict]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        kind, k, cut, threshold, rest = setting
        out = []
        for f in files:
            probation = probation_length(len(f.values))
            scores = self.artime.scores(f, (*PUBLISHED[:3], 0.0))
            t, r = choose(f.values[:probation], kind, k, cut, (threshold, rest))
            out.append(adaptive_flags(scores, probation, t, r))
        return out
