"""ARTime for NAB: adaptive resonance over downsampled stretches, an evaluation family."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import (
    GRID,
    MARGINS,
    PUBLISHED,
    ArtimeFamily,
    artime_scores,
    file_range,
)
from detectors.eval.nab_corpus import NabFile


def _scores(x: np.ndarray) -> np.ndarray:
    return artime_scores(x, *file_range(x, "file"))


def _noise(n: int, seed: int = 1) -> np.ndarray:
    return 5.0 + 0.1 * np.random.default_rng(seed).normal(size=n)


def test_a_spike_after_the_probation_scores_highest() -> None:
    x = _noise(3000)
    x[1500] = 8.0
    s = _scores(x)
    # Downsampled by 4 rows a block; the spike shows within the 8-block feature window.
    assert 1500 <= int(np.argmax(s)) < 1500 + 8 * 4
    assert s.max() == 1.0


def test_a_spike_like_one_learned_in_the_probation_is_not_novel() -> None:
    x = _noise(3000)
    x[200] = 8.0  # inside the probation (450 rows): never flagged, but learned
    x[1500] = 8.0
    s = _scores(x)
    assert not s[: probation_length(len(x))].any()
    assert not s[1500 : 1500 + 8 * 4].any()


def test_a_spike_on_a_noisy_wave_is_found_where_it_is() -> None:
    rng = np.random.default_rng(1)
    n = 2000
    x = 10 + np.sin(np.arange(n) * 2 * np.pi / 40) + 0.05 * rng.normal(size=n)
    x[1200] = 20.0
    s = _scores(x)
    assert 1200 <= int(np.argmax(s)) < 1200 + 8 * 2


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_a_periodic_series_without_anomaly_draws_no_detection(noise: float) -> None:
    rng = np.random.default_rng(1)
    x = 10 + np.sin(np.arange(4000) * 2 * np.pi / 40) + noise * rng.normal(size=4000)
    assert not _scores(x).any()


def test_scores_are_zero_or_a_confidence_and_the_same_on_every_run() -> None:
    x = _noise(3000, seed=4)
    x[1500:1600] += 1.5  # a level shift
    a, b = _scores(x), _scores(x.copy())
    assert np.array_equal(a, b)
    assert a.any()
    assert np.all((a == 0) | ((a > 0) & (a <= 1.0)))
    # Detections fall on the last row of a block only (4 rows a block here).
    assert np.all(np.flatnonzero(a) % 4 == 3)


def test_the_probation_range_clips_what_the_file_range_sees() -> None:
    x = _noise(3000)
    x[2000:] += 50.0  # far outside the probation's range
    lo, hi = file_range(x, "probation", 0.5)
    head = x[: probation_length(len(x))]
    span = head.max() - head.min()
    assert lo == pytest.approx(head.min() - 0.5 * span)
    assert hi == pytest.approx(head.max() + 0.5 * span)
    assert file_range(x, "file") == (x.min(), x.max())
    # Both scalings see the jump itself.
    assert artime_scores(x, lo, hi)[2000:2100].any()
    assert _scores(x)[2000:2100].any()


def test_bad_input_is_refused_with_what_to_do() -> None:
    x = _noise(3000)
    x[10] = math.nan
    with pytest.raises(DetectorError, match="finite"):
        _scores(x)
    with pytest.raises(DetectorError, match="at least"):
        _scores(_noise(80))
    with pytest.raises(DetectorError, match="range"):
        file_range(_noise(100), "whole")
    with pytest.raises(DetectorError, match="range"):
        ArtimeFamily(range_="whole")


def test_family_settings_and_thresholds() -> None:
    family = ArtimeFamily()
    settings = list(family.settings())
    assert len(settings) == math.prod(len(v) for v in GRID.values())
    assert all(len(s) == 5 for s in settings)
    assert family.published == (*PUBLISHED, 0.0)
    assert family.published in settings
    expanding = ArtimeFamily(range_="expanding")
    assert len(list(expanding.settings())) == len(settings) * len(MARGINS["expanding"])
    x = _noise(3000, seed=4)
    x[1500:1600] += 1.5
    files = [NabFile("realTest/a.csv", np.arange(len(x)).astype(str), x, ((1490, 1620),))]
    low, high = (family.flags(files, (*PUBLISHED[:3], t, 0.0))[0] for t in (0.0, 0.9))
    assert low.dtype == bool
    assert len(low) == len(x)
    assert np.array_equal(low, _scores(x) > 0)
    # A higher threshold keeps a subset of the detections.
    assert not (high & ~low).any()
    assert low.sum() > high.sum()


@pytest.mark.parametrize("how", ["probation", "running", "expanding"])
def test_the_streaming_ranges_leave_past_scores_untouched_by_later_values(how: str) -> None:
    x = _noise(3000, seed=4)
    x[1500:1600] += 1.5
    later = x.copy()
    later[2000:] *= 10.0  # a new maximum far above everything before row 2000
    before = artime_scores(x, *file_range(x, how, 1.0))
    after = artime_scores(later, *file_range(later, how, 1.0))
    assert before[:2000].any()
    assert np.array_equal(before[:2000], after[:2000])


def test_the_file_range_looks_ahead() -> None:
    x = _noise(3000, seed=4)
    x[1500:1600] += 1.5
    later = x.copy()
    later[2000:] *= 10.0
    # The whole file's range (NAB's inputMin/inputMax) rescales every earlier level.
    assert not np.array_equal(_scores(x)[:2000], _scores(later)[:2000])


def test_the_expanding_range_is_the_widened_probation_range_stretched_by_the_running_one() -> None:
    x = _noise(3000)
    x[2000] = 50.0
    low, high = file_range(x, "expanding", 1.0)
    head = x[: probation_length(len(x))]
    span = head.max() - head.min()
    assert high[1999] == pytest.approx(head.max() + span)
    assert high[2000] == 50.0
    assert low[-1] == pytest.approx(head.min() - span)
