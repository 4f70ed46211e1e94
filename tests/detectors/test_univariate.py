from __future__ import annotations

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.univariate import RecordDetector


def _noise(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(10.0, 1.0, n)


def test_verdicts_on_a_prefix_are_the_verdicts_on_the_whole_series() -> None:
    # Online: no point's score or flag may depend on later points.
    x = _noise(3000, 7)
    x[1200:1260] += 6.0  # a lasting shift
    x[2100] += 25.0  # a spike
    whole = RecordDetector().detect(x, probation=300)
    for cut in (900, 1230, 2101, 2600):
        part = RecordDetector().detect(x[:cut], probation=300)
        assert np.array_equal(part.flags, whole.flags[:cut])
        assert np.allclose(part.scores, whole.scores[:cut])
    assert whole.flags[1200:1265].any()
    assert whole.flags[2100]


def test_after_a_quiet_spell_a_score_below_the_record_fires() -> None:
    x = _noise(1500, 3)
    x[200] += 40.0  # leaves the range seen so far: the record score
    x[800] += 60.0  # 600 points after the last alarm, beyond the quiet spell
    x[1000] += 90.0  # only 200 points after the last alarm
    kwargs = {"record_window": 2000, "quiet": 300, "sustain_z": 1e9}
    raw = RecordDetector(**kwargs).score(x, probation=100)  # type: ignore[arg-type]
    assert 0.5 * raw[200] < raw[800] < raw[200]
    assert 0.5 * raw[200] < raw[1000] < raw[200]
    relaxed = RecordDetector(**kwargs).detect(x, probation=100)  # type: ignore[arg-type]
    strict = RecordDetector(relaxed=1.0, **kwargs).detect(x, probation=100)  # type: ignore[arg-type]
    assert np.flatnonzero(relaxed.flags).tolist() == [200, 800]
    assert np.flatnonzero(strict.flags).tolist() == [200]


def test_a_missing_daily_peak_is_found_against_the_season() -> None:
    t = np.arange(2000)
    rng = np.random.default_rng(5)
    x = np.where(t % 48 < 24, 10.0, 0.0) + rng.normal(0.0, 0.3, len(t))
    x[1488:1512] = rng.normal(0.0, 0.3, 24)  # one peak never comes
    seasonal = RecordDetector().detect(x, probation=300)
    assert np.flatnonzero(seasonal.flags).tolist() == [1488]
    part = RecordDetector().detect(x[:1500], probation=300)
    assert np.array_equal(part.flags, seasonal.flags[:1500])
    # Without the season the low values look ordinary and the square wave's edges do not.
    plain = RecordDetector(season_corr=2.0).detect(x, probation=300)
    assert not plain.flags[1488:1512].any()
    assert plain.flags.sum() > 1


def test_the_ceiling_keeps_an_early_excursion_from_masking_later_events() -> None:
    x = _noise(1000, 11)
    x[30] += 1000.0  # leaves the narrow range of the first points: a huge novelty score
    x[300] += 150.0
    capped = RecordDetector().detect(x, probation=100)
    uncapped = RecordDetector(ceiling=np.inf).detect(x, probation=100)
    assert capped.flags[300]
    assert not uncapped.flags[300]


def test_a_short_term_predictor_finds_a_step_the_long_baseline_hides() -> None:
    # A slow swing of +-10 with little noise: the trailing baseline's spread is the swing,
    # so a step of 3 is ordinary against it, but not against the last 8 points.
    t = np.arange(3000)
    x = 10.0 * np.sin(2 * np.pi * t / 700) + np.random.default_rng(21).normal(0.0, 0.1, len(t))
    x[1800:] += 3.0
    plain = RecordDetector(season_corr=2.0).detect(x, probation=300)
    predicted = RecordDetector(season_corr=2.0, predictor=8).detect(x, probation=300)
    assert not plain.flags.any()
    assert np.flatnonzero(predicted.flags).tolist() == [1800]
    part = RecordDetector(season_corr=2.0, predictor=8).detect(x[:1801], probation=300)
    assert np.array_equal(part.flags, predicted.flags[:1801])


def test_a_negative_predictor_length_is_refused() -> None:
    with pytest.raises(DetectorError, match="predictor"):
        RecordDetector(predictor=-1)
