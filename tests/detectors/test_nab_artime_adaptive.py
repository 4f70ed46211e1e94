"""ARTime with a setting chosen per file from its own probation: the characteristics, the
choice and the NAB family."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import artime_scores
from detectors.eval.nab_artime_adaptive import (
    DEFAULT_REST,
    DEFAULT_THRESHOLD,
    NEVER,
    ArtimeAdaptiveFamily,
    adaptive_flags,
    characteristic,
    choose,
    jump_ratio,
    spikiness,
)
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_detectors import artime_flags

STRICT = (0.6, 16.0)


def _calm(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 10 + np.sin(np.arange(n) * 2 * np.pi / 40) + 0.1 * rng.normal(size=n)


def _spiky(n: int, seed: int = 1) -> np.ndarray:
    x = _calm(n, seed)
    x[np.random.default_rng(seed).choice(n, n // 10, replace=False)] += 30.0
    return x


def test_a_spiky_probation_gets_the_strict_setting_a_calm_one_the_default() -> None:
    calm, spiky = _calm(450), _spiky(450)
    assert spikiness(calm, 5.0) == 0.0
    assert spikiness(spiky, 5.0) == pytest.approx(0.1, abs=0.01)
    assert choose(spiky, 0.0, 5.0, 0.05, STRICT) == STRICT
    assert choose(calm, 0.0, 5.0, 0.05, STRICT) == (DEFAULT_THRESHOLD, DEFAULT_REST)
    # A cut above the spiky file's fraction keeps the default; NEVER keeps it everywhere.
    assert choose(spiky, 0.0, 5.0, 0.2, STRICT) == (DEFAULT_THRESHOLD, DEFAULT_REST)
    assert choose(spiky, 0.0, 5.0, NEVER, STRICT) == (DEFAULT_THRESHOLD, DEFAULT_REST)
    # The largest step of the spiky probation stands far above its typical step.
    assert jump_ratio(spiky) > 20 * jump_ratio(calm)
    assert choose(spiky, 1.0, 0.0, 100.0, STRICT) == STRICT
    assert choose(calm, 1.0, 0.0, 100.0, STRICT) == (DEFAULT_THRESHOLD, DEFAULT_REST)


def test_a_median_absolute_deviation_of_0_falls_back_to_the_mean_one() -> None:
    # Resting on 0 with 4 % spikes: the median deviation is 0, the mean one is not.
    x = np.zeros(500)
    x[::25] = 50.0
    assert np.median(np.abs(x - np.median(x))) == 0.0
    assert spikiness(x, 5.0) == pytest.approx(0.04)
    assert choose(x, 0.0, 5.0, 0.02, STRICT) == STRICT
    # The median step is 0 too: the jump is measured against the mean step (39 steps of
    # 50 among 499: the spike at row 0 has no step up).
    assert jump_ratio(x) == pytest.approx(50.0 / (39 * 50.0 / 499))
    # Flat, empty or non-finite stretches have no spikes and no jumps.
    for flat in (np.full(300, 7.0), np.array([]), np.array([np.nan, np.nan])):
        assert spikiness(flat, 5.0) == 0.0
        assert jump_ratio(flat) == 0.0
        assert choose(flat, 0.0, 5.0, 0.01, STRICT) == (DEFAULT_THRESHOLD, DEFAULT_REST)


def test_bad_constants_are_refused() -> None:
    with pytest.raises(DetectorError, match="k \\(robust spreads\\)"):
        spikiness(_calm(100), 0.0)
    with pytest.raises(DetectorError, match="characteristic kind"):
        characteristic(_calm(100), 2.0, 5.0)


def _file(name: str, x: np.ndarray) -> NabFile:
    return NabFile(name, np.arange(len(x)).astype(str), x, ((2000, 2100),))


def test_the_family_scores_a_spiky_file_strictly_and_a_calm_one_as_shipped() -> None:
    family = ArtimeAdaptiveFamily()
    settings = list(family.settings())
    assert settings[0] == family.shipped
    assert len(settings) == len(set(settings))
    # No strict setting equals the shipped one.
    assert all((s[3], s[4]) != (DEFAULT_THRESHOLD, DEFAULT_REST) for s in settings[1:])
    assert len(ArtimeAdaptiveFamily(jump_cuts=()).settings()) < len(settings)
    calm, spiky = _file("realTest/calm.csv", _calm(3000)), _file("realTest/spiky.csv", _spiky(3000))
    files = [calm, spiky]
    shipped = family.flags(files, family.shipped)
    for f, fl in zip(files, shipped, strict=True):
        probation = probation_length(len(f.values))
        low, high = float(f.values.min()), float(f.values.max())
        assert np.array_equal(fl, artime_flags(f.values, probation, low, high))
    strict = family.flags(files, (0.0, 5.0, 0.05, *STRICT))
    assert np.array_equal(strict[0], shipped[0])
    probation = probation_length(3000)
    scores = artime_scores(spiky.values, float(spiky.values.min()), float(spiky.values.max()))
    assert np.array_equal(strict[1], adaptive_flags(scores, probation, *STRICT))
    # The strict setting keeps no detection under its threshold, and drops some.
    assert (scores[strict[1]] >= STRICT[0]).all()
    assert strict[1].sum() < shipped[1].sum()
