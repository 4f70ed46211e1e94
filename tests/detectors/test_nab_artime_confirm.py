"""ARTime with a confirmation of each detection: the rules and their NAB family."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import GRID, block_length
from detectors.eval.nab_artime_confirm import (
    DISCORD_RULES,
    RESTS,
    RULES,
    ArtimeConfirmFamily,
    confirm_flags,
    discord_rank,
    evidence,
)
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_detectors import artime_flags
from detectors.eval.nab_discord import discord_scores

N = 3000
PROBATION = probation_length(N)  # 450 rows; ARTime's blocks are 4 rows


def _series() -> np.ndarray:
    """A noisy daily-like cycle with one real event: a jump to a new level at 2000."""
    rng = np.random.default_rng(5)
    x = 10 + np.sin(np.arange(N) * 2 * np.pi / 40) + 0.05 * rng.normal(size=N)
    x[2000:2100] += 6.0
    return x


def _scores(at: dict[int, float]) -> np.ndarray:
    s = np.zeros(N)
    for row, score in at.items():
        s[row] = score
    return s


def test_evidence_sees_a_new_level_and_not_the_usual_cycle() -> None:
    x = _series()
    low, high = float(x.min()), float(x.max())
    assert block_length(PROBATION) == 4
    quiet_out, quiet_spread = evidence(x, 1200, PROBATION, low, high)
    # The recent 32 rows stay inside the trailing probation's range, with its spread.
    assert quiet_out == 0.0
    assert quiet_spread < 0.1
    # Ten rows into the jump: the recent stretch leaves that range by most of the file's.
    jump_out, jump_spread = evidence(x, 2010, PROBATION, low, high)
    assert jump_out > 0.5
    assert jump_spread > 0.25
    # No trailing stretch yet: no evidence.
    assert evidence(x, 10, PROBATION, low, high) == (0.0, 0.0)


def test_the_confirmation_drops_a_spurious_detection_and_keeps_the_real_one() -> None:
    x = _series()
    low, high = float(x.min()), float(x.max())
    # ARTime-like candidates: a spurious new cluster at 1200 (nothing in the values) that
    # scores higher than the real one at 2010.
    s = _scores({1200: 0.9, 2010: 0.6})
    for rule in ((1.0, 0.02, 0.0), (2.0, 0.25, 0.0)):
        kept = confirm_flags(s, x, PROBATION, low, high, 0.3, 32, rule)
        assert np.flatnonzero(kept).tolist() == [2010]
    # No rule: both kept; a threshold that drops the spurious one drops the real one too.
    none = confirm_flags(s, x, PROBATION, low, high, 0.3, 32, (0.0, 0.0, 0.0))
    assert np.flatnonzero(none).tolist() == [1200, 2010]
    high_bar = confirm_flags(s, x, PROBATION, low, high, 0.7, 32, (0.0, 0.0, 0.0))
    assert np.flatnonzero(high_bar).tolist() == [1200]


def test_a_candidate_dropped_by_the_rule_starts_no_rest() -> None:
    x = _series()
    low, high = float(x.min()), float(x.max())
    # 1995 is before the jump (no evidence) and dropped; 2010, within a 32-row rest of it,
    # is still kept.
    s = _scores({1995: 0.8, 2010: 0.6})
    kept = confirm_flags(s, x, PROBATION, low, high, 0.3, 32, (1.0, 0.02, 0.0))
    assert np.flatnonzero(kept).tolist() == [2010]
    # Without the rule, 1995 is kept and its rest hides 2010.
    plain = confirm_flags(s, x, PROBATION, low, high, 0.3, 32, (0.0, 0.0, 0.0))
    assert np.flatnonzero(plain).tolist() == [1995]


def test_the_score_record_rule_needs_a_strong_score_soon_after_a_detection() -> None:
    x = _series()
    low, high = float(x.min()), float(x.max())
    # Within half a probation (225 rows) of the 0.9 at 1000, a candidate needs 0.45.
    s = _scores({1000: 0.9, 1100: 0.4, 1150: 0.5, 1300: 0.35})
    kept = confirm_flags(s, x, PROBATION, low, high, 0.3, 32, (3.0, 0.5, 0.5))
    # 1100 is dropped; 1150 is kept; 1300 is 150 rows after 1150 (needs 0.25): kept.
    assert np.flatnonzero(kept).tolist() == [1000, 1150, 1300]
    with pytest.raises(DetectorError, match="rule kind"):
        confirm_flags(s, x, PROBATION, low, high, 0.3, 32, (7.0, 0.0, 0.0))


def test_the_discord_rank_is_high_for_a_new_shape_and_not_for_the_usual_cycle() -> None:
    x = _series()
    discord = discord_scores(x, PROBATION, 8)
    assert discord_rank(discord, 1200, PROBATION) < 0.8  # the cycle, as so often before
    assert discord_rank(discord, 2010, PROBATION) == 1.0  # ten rows into the jump
    assert discord_rank(discord, 120, PROBATION) == 1.0  # too few earlier scores to rank


def _spiky() -> np.ndarray:
    """A flat series with a one-row spike every 150 rows (ordinary for this file) and
    one new shape: a 10-row plateau at 2400."""
    y = 10 + 0.05 * np.random.default_rng(5).normal(size=N)
    y[np.arange(300, N, 150)] += 5.0
    y[2400:2410] += 3.0
    return y


def test_the_discord_rule_drops_an_ordinary_spike_and_keeps_a_new_shape() -> None:
    y = _spiky()
    low, high = float(y.min()), float(y.max())
    s = _scores({1052: 0.9, 2405: 0.6})  # two rows after a spike; five into the plateau
    kept = confirm_flags(s, y, PROBATION, low, high, 0.3, 32, (4.0, 0.99, 8.0))
    assert np.flatnonzero(kept).tolist() == [2405]
    # The spike ranks high among all stretches (a spike sits in 5 % of them) but not
    # above the bar; without the rule both are kept.
    assert 0.9 < discord_rank(discord_scores(y, PROBATION, 8), 1052, PROBATION) < 0.99
    plain = confirm_flags(s, y, PROBATION, low, high, 0.3, 32, (0.0, 0.0, 0.0))
    assert np.flatnonzero(plain).tolist() == [1052, 2405]


def _burst_file() -> NabFile:
    rng = np.random.default_rng(2)
    x = 10 + np.sin(np.arange(N) * 2 * np.pi / 40) + 0.05 * rng.normal(size=N)
    x[1500:1700] += np.random.default_rng(0).normal(size=200)  # the series turns noisy
    return NabFile("realTest/a.csv", np.arange(N).astype(str), x, ((1490, 1620),))


def test_the_family_holds_the_shipped_detector_and_the_rules() -> None:
    family = ArtimeConfirmFamily()
    settings = list(family.settings())
    assert len(settings) == math.prod(len(v) for v in GRID.values()) * len(RESTS) * len(RULES)
    assert family.shipped in settings
    f = _burst_file()
    shipped = family.flags([f], family.shipped)[0]
    expected = artime_flags(f.values, PROBATION, float(f.values.min()), float(f.values.max()))
    assert np.array_equal(shipped, expected)
    assert np.flatnonzero(shipped).tolist() == [1507, 1575]
    # The noise burst widens the spread at both detections: the spread rule keeps both.
    spread = family.flags([f], (*family.shipped[:5], 2.0, 0.25, 0.0))[0]
    assert np.flatnonzero(spread).tolist() == [1507, 1575]


def test_the_discord_family_holds_the_shipped_detector_and_its_rules() -> None:
    family = ArtimeConfirmFamily(rules=DISCORD_RULES)
    settings = list(family.settings())
    assert len(settings) == math.prod(len(v) for v in GRID.values()) * len(RESTS) * 9
    assert family.shipped in settings
    f = _burst_file()
    assert np.array_equal(
        family.flags([f], family.shipped)[0],
        artime_flags(f.values, PROBATION, float(f.values.min()), float(f.values.max())),
    )
    # The burst is a shape the file has not had: the strictest discord rule keeps both.
    strict = family.flags([f], (*family.shipped[:5], 4.0, 0.95, 8.0))[0]
    assert np.flatnonzero(strict).tolist() == [1507, 1575]
