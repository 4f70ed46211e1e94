"""The discord design for NAB: distance of the recent stretch to its nearest earlier one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.eval.nab import PROFILES
from detectors.eval.nab_discord import (
    DiscordFamily,
    DiscordRecordFamily,
    discord_scores,
    lasting,
    left_discord,
    record_flags,
)
from detectors.eval.nab_loco import leave_one_out
from tests.detectors.test_nab_loco import _corpus

PROBATION = 150


def _flags(x: np.ndarray, m: int = 8) -> np.ndarray:
    scores = discord_scores(x, PROBATION, m)
    return np.flatnonzero(record_flags(scores, PROBATION, 2.0, 4 * PROBATION, 0.5))


def _noisy_sine(n: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.sin(np.arange(n) / 5.0) + 0.05 * rng.normal(size=n)


def test_left_discord_is_the_nearest_earlier_non_overlapping_stretch() -> None:
    rng = np.random.default_rng(0)
    z, m = rng.normal(size=90), 6
    got = left_discord(z, m, block=7)
    for t in range(2 * m - 1, len(z)):
        here = z[t - m + 1 : t + 1]
        past = [z[s - m + 1 : s + 1] for s in range(m - 1, t - m + 1)]
        want = min(np.sqrt(np.mean((here - p) ** 2)) for p in past)
        assert got[t] == pytest.approx(want, abs=1e-9)
    assert not got[: 2 * m - 1].any()


def test_a_spike_is_flagged_where_it_happens() -> None:
    # The score is an RMS over m points: one value 8 spreads away from the sine scores
    # about 8 / sqrt(8), above the floor of 2.
    x = _noisy_sine()
    x[600] += 8.0
    assert _flags(x).tolist() == [600]


def test_a_level_shift_is_flagged_once_at_its_start() -> None:
    x = _noisy_sine()
    x[600:] += 3.0
    flags = _flags(x)
    assert len(flags) == 1
    assert 600 <= flags[0] <= 604


def test_a_pattern_seen_before_is_not_a_discord() -> None:
    # A daily spike: new the first time after the probation, known from then on.
    x = _noisy_sine(1400)
    x[100::250] += 5.0
    assert _flags(x).tolist() == []
    scores = discord_scores(x, PROBATION, 8)
    assert scores[850:860].max() < 1.0


def test_a_flat_series_scores_zero_and_never_fires() -> None:
    x = np.full(800, 7.0)
    assert not discord_scores(x, PROBATION, 8).any()
    assert _flags(x).tolist() == []


def test_nan_input_is_refused_with_a_reason() -> None:
    x = _noisy_sine()
    x[300] = np.nan
    with pytest.raises(DetectorError, match="finite"):
        discord_scores(x, PROBATION, 8)
    with pytest.raises(DetectorError, match="at least 2"):
        left_discord(np.zeros(10), 1)


def test_the_families_go_through_the_held_out_protocol(tmp_path: Path) -> None:
    _corpus(tmp_path)
    small = DiscordFamily({"m": (8.0,), "history": (4.0,), "relaxed": (0.5,), "floor": (2.0,)})
    result = leave_one_out(tmp_path, small)
    held = {(h.category, h.profile): h for h in result.held}
    # catA's spike (8 SD) is found wherever it is scored from.
    for p in PROFILES:
        assert held[("catA", p.name)].score > 50.0
    fusion = DiscordRecordFamily()
    assert {s[0] for s in fusion.settings()} == {0.0, 1.0, 2.0, 3.0}


def test_the_sustained_trigger_finds_a_series_turning_noisy() -> None:
    # From 700 on, a small noise. With the record's bar out of reach (ten times the
    # record), only the sustained trigger can see it: the stretches' mean discord climbs
    # far out of its history.
    rng = np.random.default_rng(5)
    x = _noisy_sine(1400)
    x[700:] += 0.35 * rng.normal(size=700)
    scores = discord_scores(x, PROBATION, 8)
    span = 4 * PROBATION
    assert lasting(scores, 10, span)[700:760].max() > 4.5
    assert lasting(scores, 10, span)[200:700].max() < 4.5
    plain = np.flatnonzero(record_flags(scores, PROBATION, 0.2, span, 10.0))
    sustained = np.flatnonzero(record_flags(scores, PROBATION, 0.2, span, 10.0, 10, 4.5))
    assert plain.tolist() == []
    assert 700 <= sustained[0] < 760


def test_a_horizon_bounds_the_search_and_changes_nothing_within_it() -> None:
    # A pattern seen once early and again late: with the whole history its return is no
    # discord; with a horizon shorter than the gap it is one again.
    rng = np.random.default_rng(3)
    z = 0.05 * rng.normal(size=6000)
    bump = np.sin(np.linspace(0, np.pi, 16)) * 3
    z[500:516] += bump
    z[5500:5516] += bump
    whole = left_discord(z, 16)
    bounded = left_discord(z, 16, horizon=1000)
    assert whole[5515] < 0.5
    assert bounded[5515] > 1.0
    # Every row with fewer earlier stretches than the horizon gets the same score.
    assert np.array_equal(left_discord(z, 16, horizon=6000), whole)
    assert np.array_equal(bounded[:1000], whole[:1000])
    with pytest.raises(DetectorError, match="horizon must be at least 1"):
        left_discord(z, 16, horizon=0)
