"""The anomaly-likelihood designs for NAB: bounded surprise, its likelihood, rank means."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.eval.nab import PROFILES
from detectors.eval.nab_likelihood import (
    RANK_MEMBERS,
    LikelihoodFamily,
    LikelihoodRecordFamily,
    RankMeanFamily,
    bounded_surprise,
    likelihood_z,
    rank_mean,
    tail_probability,
    threshold_flags,
    trailing_rank,
)
from detectors.eval.nab_loco import leave_one_out
from detectors.univariate import RecordDetector
from tests.detectors.test_nab_loco import _corpus

PROBATION = 150


def _noisy_sine(n: int = 1400, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sin(np.arange(n) / 5.0) + 0.05 * rng.normal(size=n)


def _slow_sine(n: int = 1400) -> np.ndarray:
    rng = np.random.default_rng(4)
    return np.sin(np.arange(n) / 50.0) + 0.05 * rng.normal(size=n)


def test_surprise_is_bounded_and_a_new_extreme_scores_one() -> None:
    x = _slow_sine()
    x[600] += 40.0
    x[1000] += 2.0
    raw = bounded_surprise(x, PROBATION, 0, 2.0, 6.0)
    assert raw.min() >= 0.0
    assert raw.max() <= 1.0
    assert raw[600] == 1.0  # beyond every value seen
    # A spike 20 times smaller than the first one saturates as well: the size past the
    # saturation does not matter, only that the point was not predicted.
    assert raw[1000] == 1.0
    assert np.median(raw[PROBATION:]) < 0.3
    assert not raw[: PROBATION // 4].any()


def test_a_smaller_spike_after_a_larger_one_is_found_where_the_record_is_blind() -> None:
    x = _slow_sine()
    x[500] += 40.0
    x[1000] += 2.0
    raw = bounded_surprise(x, PROBATION, 0, 2.0, 6.0)
    z = likelihood_z(raw, 1, None, 0.05)
    flags = np.flatnonzero(threshold_flags(z, 4.0, PROBATION))
    assert 1000 in flags.tolist()
    record = np.flatnonzero(RecordDetector().detect(x, PROBATION).flags)
    assert 1000 not in record.tolist()


def test_the_likelihood_rises_when_a_series_turns_noisy() -> None:
    rng = np.random.default_rng(5)
    x = _noisy_sine()
    x[800:] += 0.4 * rng.normal(size=600)
    raw = bounded_surprise(x, PROBATION, 8, 2.0, 6.0)
    z = likelihood_z(raw, 10, 4 * PROBATION, 0.05)
    assert z[800:850].max() > 5.0
    assert z[PROBATION:800].max() < 5.0
    flags = np.flatnonzero(threshold_flags(z, 5.0, PROBATION))
    assert 800 <= flags[0] < 850


def test_flags_are_one_a_quarter_probation_and_none_in_the_probation() -> None:
    z = np.full(1000, 10.0)
    flags = np.flatnonzero(threshold_flags(z, 3.0, PROBATION))
    assert flags[0] == PROBATION
    assert np.all(np.diff(flags) == PROBATION // 4 + 1)


def test_tail_probability_is_numentas_likelihood() -> None:
    assert tail_probability(0.0) == pytest.approx(0.5)
    assert tail_probability(4.2649) == pytest.approx(1e-5, rel=1e-3)


def test_trailing_rank_is_the_fraction_of_earlier_scores_below() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=60).astype(float)
    got = trailing_rank(x, start=3)
    for i in range(6, len(x)):
        past = x[3:i]
        want = (np.sum(past < x[i]) + 0.5 * np.sum(past == x[i])) / len(past)
        assert got[i] == pytest.approx(want)
    assert not got[:5].any()


def test_rank_mean_averages_the_chosen_members() -> None:
    ranks = {name: np.full(4, float(j)) for j, name in enumerate(RANK_MEMBERS)}
    assert rank_mean(ranks, 0b0101).tolist() == [1.0] * 4  # members 0 and 2
    with pytest.raises(DetectorError, match="at least one"):
        rank_mean(ranks, 0)


def test_bad_input_is_refused_with_a_reason() -> None:
    x = _noisy_sine()
    x[300] = np.nan
    with pytest.raises(DetectorError, match="finite"):
        bounded_surprise(x, PROBATION, 8, 2.0, 6.0)
    with pytest.raises(DetectorError, match="saturate"):
        bounded_surprise(_noisy_sine(), PROBATION, 8, 2.0, 0.0)


def test_the_families_go_through_the_held_out_protocol(tmp_path: Path) -> None:
    _corpus(tmp_path)
    small = LikelihoodFamily(
        {
            "predictor": (8.0,),
            "season_corr": (2.0,),
            "saturate": (6.0,),
            "short": (1.0,),
            "history": (math.inf,),
            "std_floor": (0.05,),
            "z": (4.0,),
        }
    )
    held = {(h.category, h.profile): h for h in leave_one_out(tmp_path, small).held}
    # catA's spike (8 SD) is found wherever it is scored from.
    for p in PROFILES:
        assert held[("catA", p.name)].score > 50.0
    ranks = RankMeanFamily({"members": (3.0,), "level": (0.999,)})
    assert len(leave_one_out(tmp_path, ranks).held) == 2 * len(PROFILES)
    fusion = LikelihoodRecordFamily()
    assert {s[0] for s in fusion.settings()} == {0.0, 1.0, 2.0, 3.0}
