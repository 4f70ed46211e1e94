"""ARTime with a rest and a second opinion on each detection, for the NAB protocol.

A measured design (docs/benchmarks.md, "NAB: ARTime with a confirmation, held out"):
ARTime (file range, detectors/eval/nab_artime.py) with the rest of nab_artime_rest.py,
where a candidate detection (a new cluster scoring at least the threshold, outside the
rest) is kept only when a rule agrees. Two kinds of rule, each a constant of the grid
chosen by the leave-one-category-out protocol like ARTime's own:

- Evidence in the values (``outside``, ``spread``): the recent stretch (ARTime's feature
  window, ``window`` blocks up to the candidate's row) against the trailing stretch
  before it (one probation long). ``outside``: how far the recent stretch leaves the
  trailing stretch's range, as a fraction of the file's range (the range NAB hands the
  detector); ``spread``: the absolute log ratio of the two stretches' standard deviations
  (each floored at 0.1 % of the file's range). A candidate is kept when its evidence
  reaches the bar.
- The file's own scores (``record``): within ``span`` probations after a kept detection,
  a candidate is kept only when it scores at least ``ratio`` times the strongest
  detection kept in that span (an adaptive threshold: ARTime scores 0 through the
  probation, so there is no probation score to take a quantile of; the scores kept so
  far are the file's only score history).
- How new the recent shape is for this file (``discord``, nab_discord.py): the largest
  discord score (distance of the ``m`` values ending at a row to their nearest earlier
  stretch) over the last half of ARTime's feature window, ranked among every earlier
  discord score of the file; a candidate is kept when that rank reaches the bar (a file
  where new shapes are ordinary, a spiky one, needs a rarer one).

A dropped candidate starts no rest and enters no history.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import GRID, PUBLISHED, ArtimeFamily, block_length
from detectors.eval.nab_artime_rest import rest_rows
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_discord import discord_scores

Setting = tuple[float, ...]

#: Rule kinds: 0 none (ARTime with a rest), 1 ``outside``, 2 ``spread``, 3 ``record``,
#: 4 ``discord``.
KINDS = ("none", "outside", "spread", "record", "discord")
#: The rules tried: (kind, a, b). ``outside``/``spread``: a is the bar; ``record``: a is
#: the ratio, b the span in probations.
RULES: tuple[tuple[float, float, float], ...] = (
    (0.0, 0.0, 0.0),
    *((1.0, bar, 0.0) for bar in (0.01, 0.02, 0.05)),
    *((2.0, bar, 0.0) for bar in (0.1, 0.25)),
    *((3.0, ratio, span) for ratio in (0.5, 0.75) for span in (0.25, 0.5)),
)
#: The ``discord`` rules (a second grid, ``DISCORD_RULES``): (4, rank bar, m).
DISCORD_RULES: tuple[tuple[float, float, float], ...] = (
    (0.0, 0.0, 0.0),
    *((4.0, bar, m) for bar in (0.5, 0.8, 0.9, 0.95) for m in (8.0, 16.0)),
)
#: Rests tried (ARTime's blocks): none, and the shipped 8.
RESTS = (0.0, 8.0)
#: ARTime's feature window in blocks (the recent stretch of the evidence).
WINDOW_BLOCKS = 8
#: Floor of a stretch's standard deviation, as a fraction of the file's range.
SPREAD_FLOOR = 0.001
#: Earlier discord scores a rank needs (fewer: the candidate is kept).
MIN_RANKED = 10


def evidence(
    values: np.ndarray, row: int, probation: int, low: float, high: float
) -> tuple[float, float]:
    """(outside, spread) of the recent stretch ending at ``row`` against the trailing one."""
    x = np.asarray(values, dtype=float)
    recent_len = WINDOW_BLOCKS * block_length(probation)
    start = max(0, row - recent_len + 1)
    recent = x[start : row + 1]
    trailing = x[max(0, start - probation) : start]
    if len(trailing) == 0:
        return 0.0, 0.0
    span = (high - low) or 1.0
    outside = max(0.0, float(recent.max() - trailing.max()), float(trailing.min() - recent.min()))
    floor = SPREAD_FLOOR * span
    spread = abs(math.log((float(recent.std()) + floor) / (float(trailing.std()) + floor)))
    return outside / span, spread


def discord_rank(discord: np.ndarray, row: int, probation: int) -> float:
    """The rank (0 to 1) of the largest discord score over the last half feature window
    up to ``row`` among the file's earlier discord scores (from a quarter probation on,
    where they start); 1 with fewer than ``MIN_RANKED`` earlier scores."""
    start = max(0, row - WINDOW_BLOCKS * block_length(probation) // 2 + 1)
    recent = float(discord[start : row + 1].max())
    earlier = discord[probation // 4 : max(probation // 4, start)]
    if len(earlier) < MIN_RANKED:
        return 1.0
    return float((earlier < recent).mean())


def confirm_flags(
    scores: np.ndarray,
    values: np.ndarray,
    probation: int,
    low: float,
    high: float,
    threshold: float,
    rest: int,
    rule: tuple[float, float, float],
    evidence_at: Callable[[int], tuple[float, float]] | None = None,
    discord: np.ndarray | None = None,
) -> np.ndarray:
    """ARTime's candidates (score > 0 and at least ``threshold``) kept by the rest (in
    rows) and the rule (``RULES``, ``DISCORD_RULES``); ``evidence_at`` (row ->
    ``evidence``) and ``discord`` (the file's discord scores for the rule's ``m``) may
    serve what is already computed."""
    kind, a, b = rule
    if kind not in (0.0, 1.0, 2.0, 3.0, 4.0):
        raise DetectorError(f"rule kind must be 0 to {len(KINDS) - 1}, got {kind!r}")
    s = np.asarray(scores, dtype=float)
    out = np.zeros(len(s), dtype=bool)
    kept: list[tuple[int, float]] = []
    for i in np.flatnonzero((s > 0) & (s >= threshold)):
        row = int(i)
        if kept and row - kept[-1][0] <= rest:
            continue
        if kind in (1.0, 2.0):
            outside, spread = (
                evidence_at(row) if evidence_at else evidence(values, row, probation, low, high)
            )
            if (outside if kind == 1.0 else spread) < a:
                continue
        elif kind == 3.0:
            recent = [k for r, k in kept if row - r <= b * probation]
            if recent and s[row] < a * max(recent):
                continue
        elif kind == 4.0:
            if discord is None:
                discord = discord_scores(values, probation, int(b))
            if discord_rank(discord, row, probation) < a:
                continue
        out[row] = True
        kept.append((row, float(s[row])))
    return out


class ArtimeConfirmFamily:
    """ARTime (file range) over ``GRID``, ``RESTS`` and ``RULES``: a setting is
    (initial_rho, chomp, lb_rise, threshold, rest, kind, a, b)."""

    name = "artime_confirm"

    def __init__(
        self,
        grid: dict[str, tuple[float, ...]] | None = None,
        rests: Sequence[float] = RESTS,
        rules: Sequence[tuple[float, float, float]] = RULES,
    ) -> None:
        self.grid = grid or GRID
        self.rests = tuple(rests)
        self.rules = tuple(rules)
        self.artime = ArtimeFamily(self.grid)
        self._evidence: dict[tuple[str, int], tuple[float, float]] = {}
        self._discord: dict[tuple[str, int], np.ndarray] = {}
        #: The shipped detector: published constants, threshold 0.3, rest 8, no rule.
        self.shipped: Setting = (*PUBLISHED[:3], 0.3, 8.0, 0.0, 0.0, 0.0)

    def settings(self) -> Iterable[Setting]:
        return [
            (*c, r, *rule)
            for c, r, rule in itertools.product(
                itertools.product(*self.grid.values()), self.rests, self.rules
            )
        ]

    def evidence_at(self, f: NabFile) -> Callable[[int], tuple[float, float]]:
        """``evidence`` at a row of ``f`` (file range), computed once per row."""
        probation = probation_length(len(f.values))
        low, high = float(f.values.min()), float(f.values.max())

        def at(row: int) -> tuple[float, float]:
            key = (f.name, row)
            if key not in self._evidence:
                self._evidence[key] = evidence(f.values, row, probation, low, high)
            return self._evidence[key]

        return at

    def discord(self, f: NabFile, m: float) -> np.ndarray:
        """The discord scores of ``f`` for stretches of ``m`` values, computed once."""
        key = (f.name, int(m))
        if key not in self._discord:
            self._discord[key] = discord_scores(f.values, probation_length(len(f.values)), int(m))
        return self._discord[key]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        initial_rho, chomp, lb_rise, threshold, rest, kind, a, b = setting
        out = []
        for f in files:
            probation = probation_length(len(f.values))
            scores = self.artime.scores(f, (initial_rho, chomp, lb_rise, 0.0))
            out.append(
                confirm_flags(
                    scores,
                    f.values,
                    probation,
                    float(f.values.min()),
                    float(f.values.max()),
                    threshold,
                    rest_rows(rest, probation),
                    (kind, a, b),
                    self.evidence_at(f),
                    self.discord(f, b) if kind == 4.0 else None,
                )
            )
        return out
