"""ARTime with a rest after each detection kept: the rest filter and its NAB family."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import GRID, PUBLISHED, ArtimeFamily, block_length
from detectors.eval.nab_artime_rest import RESTS, ArtimeRestFamily, rest_flags, rest_rows
from detectors.eval.nab_corpus import NabFile


def _flags(n: int, at: list[int]) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[at] = True
    return out


def test_a_flag_inside_the_rest_is_dropped_and_does_not_restart_it() -> None:
    kept = rest_flags(_flags(50, [10, 12, 20, 25, 40]), 10)
    assert np.flatnonzero(kept).tolist() == [10, 25, 40]
    # 8 is dropped; the rest still runs from 0, so 16 is kept.
    assert np.flatnonzero(rest_flags(_flags(20, [0, 8, 16]), 10)).tolist() == [0, 16]
    assert np.array_equal(rest_flags(_flags(50, [3, 4, 5]), 0), _flags(50, [3, 4, 5]))


def test_rest_units() -> None:
    probation = probation_length(3000)
    assert rest_rows(8, probation) == 8 * block_length(probation) == 32
    assert rest_rows(0.1, probation, "probation") == 45
    with pytest.raises(DetectorError, match="rest unit"):
        rest_rows(1, probation, "minutes")
    with pytest.raises(DetectorError, match="rest unit"):
        ArtimeRestFamily("minutes")


def _burst_file() -> NabFile:
    rng = np.random.default_rng(2)
    x = 10 + np.sin(np.arange(3000) * 2 * np.pi / 40) + 0.05 * rng.normal(size=3000)
    x[1500:1700] += np.random.default_rng(0).normal(size=200)  # the series turns noisy
    return NabFile("realTest/a.csv", np.arange(len(x)).astype(str), x, ((1490, 1620),))


def test_the_family_drops_a_burst_of_detections_on_one_event() -> None:
    family = ArtimeRestFamily()
    settings = list(family.settings())
    assert len(settings) == math.prod(len(v) for v in GRID.values()) * len(RESTS["block"])
    assert family.published in settings
    files = [_burst_file()]
    alone = ArtimeFamily().flags(files, (*PUBLISHED, 0.0))[0]
    no_rest = family.flags(files, (*PUBLISHED, 0.0))[0]
    rested = family.flags(files, (*PUBLISHED, 8.0))[0]
    assert np.array_equal(no_rest, alone)
    # ARTime founds a new cluster every block while the noise enters its 8-block window;
    # with a rest of 8 blocks the first stands for them, a later event still counts.
    assert np.flatnonzero(alone).tolist() == [1507, 1511, 1515, 1575]
    assert np.flatnonzero(rested).tolist() == [1507, 1575]
    # A rest in probations: 0.5 probation (225 rows) keeps the first only.
    long_rest = ArtimeRestFamily("probation").flags(files, (*PUBLISHED, 0.5))[0]
    assert np.flatnonzero(long_rest).tolist() == [1507]
