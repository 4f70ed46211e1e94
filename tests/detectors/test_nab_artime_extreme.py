"""ARTime with a discord confirmation joined by the new-extreme trigger: the NAB family."""

from __future__ import annotations

import math

import numpy as np

from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import GRID
from detectors.eval.nab_artime_confirm import DISCORD_RULES, RESTS
from detectors.eval.nab_artime_extreme import MARGINS, ArtimeExtremeFamily
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_detectors import artime_flags
from detectors.eval.nab_extreme import new_extreme_flags

N = 3000


def _file() -> NabFile:
    """A wave turning noisy at 1500 for 200 rows, and a spike above every earlier value
    at 2500."""
    rng = np.random.default_rng(2)
    x = 10 + np.sin(np.arange(N) * 2 * np.pi / 40) + 0.05 * rng.normal(size=N)
    x[1500:1700] += np.random.default_rng(0).normal(size=200)
    x[2500] = 20.0
    return NabFile("realTest/a.csv", np.arange(N).astype(str), x, ((1490, 1620),))


def test_the_family_holds_the_shipped_artime_and_every_rule_and_margin() -> None:
    family = ArtimeExtremeFamily()
    settings = list(family.settings())
    grid = math.prod(len(v) for v in GRID.values())
    assert len(settings) == grid * len(RESTS) * len(DISCORD_RULES) * len(MARGINS)
    assert family.shipped in settings
    f = _file()
    low, high = float(f.values.min()), float(f.values.max())
    expected = artime_flags(f.values, probation_length(N), low, high)
    assert np.array_equal(family.flags([f], family.shipped)[0], expected)
    assert np.flatnonzero(expected).tolist() == [1507, 1815, 2503]


def test_the_union_keeps_one_flag_per_rest() -> None:
    f = _file()
    family = ArtimeExtremeFamily()
    # The trigger alone fires where the burst first leaves the range and at the spike.
    assert np.flatnonzero(new_extreme_flags(f.values, probation_length(N), 0.05)).tolist() == [
        1508,
        2500,
    ]
    # Joined to ARTime (no rule) within its rest of 8 blocks (32 rows): 1508 falls in the
    # rest after ARTime's 1507, and ARTime's 2503 in the rest after the spike's 2500.
    joined = family.flags([f], (*family.shipped[:8], 0.05))[0]
    assert np.flatnonzero(joined).tolist() == [1507, 1815, 2500]
    # With no rest every flag of either is kept.
    no_rest = family.flags([f], (*family.shipped[:4], 0.0, *family.shipped[5:8], 0.05))[0]
    assert np.flatnonzero(no_rest).tolist() == [1507, 1508, 1815, 2500, 2503]


def test_the_discord_rule_drops_a_shape_the_file_has_had() -> None:
    f = _file()
    family = ArtimeExtremeFamily()
    chosen = (*family.shipped[:5], 4.0, 0.9, 16.0, 0.05)
    assert np.flatnonzero(family.flags([f], chosen)[0]).tolist() == [1507, 2500]
