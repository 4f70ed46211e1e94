"""A discord detector for the NAB protocol: how far the recent stretch is from anything seen.

A measured design, not a shipped detector (docs/benchmarks.md, "NAB: a discord family").
The score of a point is the distance of the ``m`` values ending there to their nearest
neighbour among the earlier stretches of ``m`` values that end at least ``m`` points
before it (a left nearest neighbour, the matrix profile's streaming half): a pattern that
has happened before, however large (a daily spike, a season, a spike of a height seen
already), scores low; a shape or level never seen scores high until it has happened
once. Values are scaled by the probation's median and robust spread (MAD, floored at 2 %
of the probation's range), so the score is in robust-z units per point, whatever the
series' scale. The first quarter probation scores 0 (too few neighbours).

Flags, without labels: a point is an anomaly when its score beats ``floor`` and
``relaxed`` times the largest score of the trailing ``history`` points (a record), and
the last anomaly is more than a quarter probation ago. With a sustained trigger
(``DISCORD_SUSTAINED_GRID``), a point above ``floor`` is an anomaly too when the mean
score of its last ``sustain`` points stands ``sustain_z`` standard deviations above the
history of that mean (a new regime whose single stretches are modestly new, such as a
series turning noisy). ``DiscordFamily`` gives its
constants to nab_loco's protocol; ``DiscordRecordFamily`` joins it with the record
detector by nab_families' combination rules, the rule itself a constant of the grid.

Cost: O(n² m) per series (blocked matrix products), for evaluation only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_families import BOTH, CAD, EITHER, RECORD, RecordFamily, combine

Setting = tuple[float, ...]

#: The constants tried: subsequence length in points, record history in probations,
#: relaxed fraction of the record, floor in robust z per point.
DISCORD_GRID: dict[str, tuple[float, ...]] = {
    "m": (8.0, 16.0, 32.0),
    "history": (1.0, 2.0, 4.0),
    "relaxed": (0.5, 0.75, 1.0),
    "floor": (1.0, 2.0, 4.0),
}
#: The same with the sustained trigger: points averaged, and its z (infinite: off).
DISCORD_SUSTAINED_GRID: dict[str, tuple[float, ...]] = {
    "m": (8.0, 16.0, 32.0),
    "history": (2.0, 4.0),
    "relaxed": (0.5, 1.0),
    "floor": (1.0, 2.0),
    "sustain": (10.0, 30.0),
    "sustain_z": (3.0, 4.5, 6.0, float("inf")),
}
#: The record detector's settings joined with the discord grid (nab_loco.GRID's order):
#: the shipped constants with sustain z 3 or 4.5 and the predictor off or 32 points.
FUSION_RECORD_SETTINGS: tuple[Setting, ...] = tuple(
    (4.0, z, 0.5, 4.0, 0.8, 0.25, p) for z in (3.0, 4.5) for p in (0.0, 32.0)
)


def probation_scaled(values: np.ndarray, probation: int) -> np.ndarray:
    """The values less the probation's median, over its robust spread."""
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)):
        raise DetectorError("the discord score needs finite values; drop or fill NaN rows first")
    head = x[: max(probation, 1)]
    median = float(np.median(head))
    mad = 1.4826 * float(np.median(np.abs(head - median)))
    spread = max(mad, 0.02 * float(head.max() - head.min()), 1e-9)
    return (x - median) / spread


def left_discord(z: np.ndarray, m: int, block: int = 512, horizon: int | None = None) -> np.ndarray:
    """Each point's distance (RMS per value) from the ``m`` values ending there to the
    nearest earlier ``m`` values ending at least ``m`` points before; 0 where none.

    ``horizon``: search at least that many earlier stretches, not all of them (a block of
    ``block`` rows searches from ``horizon`` before its first row), so that a long series
    costs time linear in its length and bounded memory; None searches all (quadratic).
    """
    if m < 2:
        raise DetectorError(f"the discord length m must be at least 2, got {m}")
    if horizon is not None and horizon < 1:
        raise DetectorError(f"the discord horizon must be at least 1 stretch, got {horizon}")
    n = len(z)
    out = np.zeros(n)
    if n < 2 * m:
        return out
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(z, dtype=float), m)
    count = len(windows)
    norms = (windows * windows).sum(axis=1)
    for start in range(m, count, block):
        stop = min(start + block, count)
        first = 0 if horizon is None else max(0, start - m - horizon)
        cols = stop - m
        d2 = (
            norms[start:stop, None]
            + norms[None, first:cols]
            - 2.0 * windows[start:stop] @ windows[first:cols].T
        )
        rows = np.arange(start, stop)[:, None]
        d2[np.arange(first, cols)[None, :] > rows - m] = np.inf
        out[start + m - 1 : stop + m - 1] = np.sqrt(np.maximum(d2.min(axis=1), 0.0) / m)
    return out


def discord_scores(
    values: np.ndarray, probation: int, m: int, horizon: int | None = None
) -> np.ndarray:
    """The discord score of every point (``horizon``: as ``left_discord``'s); the first
    quarter probation scores 0."""
    scores = left_discord(probation_scaled(values, probation), m, horizon=horizon)
    scores[: probation // 4] = 0.0
    return scores


def lasting(scores: np.ndarray, sustain: int, history: int) -> np.ndarray:
    """How far the mean of the last ``sustain`` scores stands above the history of that
    mean over the ``history`` points before them (z units)."""
    recent = pd.Series(scores).rolling(sustain, min_periods=1).mean()
    past = recent.rolling(history, min_periods=20)
    mean, std = past.mean().shift(sustain), past.std().shift(sustain)
    return np.asarray(((recent - mean) / (std + 1e-9)).fillna(0.0), dtype=float)


def record_flags(
    scores: np.ndarray,
    probation: int,
    floor: float,
    history: int,
    relaxed: float,
    sustain: int = 0,
    sustain_z: float = float("inf"),
) -> np.ndarray:
    """Points whose score beats ``floor`` and ``relaxed`` times the trailing record (or,
    with ``sustain``, whose recent mean is ``sustain_z`` above its history), at most one a
    quarter probation, none in the probation."""
    record = pd.Series(scores).rolling(history, min_periods=1).max().shift(1)
    bar = record.fillna(np.inf).to_numpy()
    candidates = (scores > floor) & (scores > relaxed * bar)
    if sustain and np.isfinite(sustain_z):
        candidates |= (scores > floor) & (lasting(scores, sustain, history) > sustain_z)
    suppress = max(probation // 4, 1)
    flags = np.zeros(len(scores), dtype=bool)
    last = -(10**9)
    for i in np.flatnonzero(candidates):
        if i < probation or i - last <= suppress:
            continue
        flags[i] = True
        last = int(i)
    return flags


class DiscordFamily:
    """The discord detector over ``DISCORD_GRID`` (scores cached per file and length)."""

    name = "discord"

    def __init__(self, grid: dict[str, tuple[float, ...]] | None = None) -> None:
        self.grid = grid or DISCORD_GRID
        self._scores: dict[tuple[str, int], np.ndarray] = {}

    def settings(self) -> Iterable[Setting]:
        return list(itertools.product(*self.grid.values()))

    def scores(self, f: NabFile, m: int) -> np.ndarray:
        key = (f.name, m)
        if key not in self._scores:
            self._scores[key] = discord_scores(f.values, probation_length(len(f.values)), m)
        return self._scores[key]

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        m, history, relaxed, floor = setting[:4]
        sustain, sustain_z = setting[4:] if len(setting) > 4 else (0.0, float("inf"))
        out = []
        for f in files:
            probation = probation_length(len(f.values))
            span = int(history * max(probation, 50))
            scores = self.scores(f, int(m))
            out.append(
                record_flags(scores, probation, floor, span, relaxed, int(sustain), sustain_z)
            )
        return out


class DiscordRecordFamily:
    """The record detector and the discord detector joined by a rule the grid chooses.

    A setting is (rule, the discord's four constants, the record grid's seven); the rules
    are nab_families' RECORD (record alone), CAD (here: the discord alone), EITHER, BOTH.
    """

    name = "discord_fusion"

    def __init__(self) -> None:
        self.record = RecordFamily()
        self.discord = DiscordFamily()
        self._records: dict[Setting, list[np.ndarray]] = {}
        self._discords: dict[Setting, list[np.ndarray]] = {}

    def settings(self) -> Iterable[Setting]:
        discords = list(self.discord.settings())
        records = FUSION_RECORD_SETTINGS
        out = [(RECORD, *discords[0], *r) for r in records]
        out += [(CAD, *d, *records[0]) for d in discords]
        out += [(rule, *d, *r) for rule in (EITHER, BOTH) for d in discords for r in records]
        return out

    def flags(self, files: Sequence[NabFile], setting: Setting) -> list[np.ndarray]:
        rule, discord, record = setting[0], setting[1:5], setting[5:]
        if record not in self._records:
            self._records[record] = self.record.flags(files, record)
        if discord not in self._discords:
            self._discords[discord] = self.discord.flags(files, discord)
        a, b = self._records[record], self._discords[discord]
        return [
            combine(x, y, rule, probation_length(len(f.values)))
            for x, y, f in zip(a, b, files, strict=True)
        ]
