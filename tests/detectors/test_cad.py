from __future__ import annotations

import numpy as np
import pytest

from detectors.cad import CadOse, cad_scores, probation_range, rest_filter
from detectors.errors import DetectorError
from detectors.eval.nab_families import BOTH, CAD, EITHER, RECORD, combine


def _pattern(n: int) -> np.ndarray:
    return np.tile([0.0, 1.0, 2.0, 3.0, 2.0, 1.0], n // 6 + 1)[:n]


def test_a_learnt_pattern_stops_surprising_and_a_break_in_it_surprises() -> None:
    x = _pattern(600)
    x[500] = 0.0  # a value from the range, in the wrong place of the cycle
    raw = cad_scores(x, 0.0, 3.0)
    assert raw[:12].mean() > 0.4  # everything is new at first
    assert raw[300:498].max() < 0.2  # the cycle has been learnt
    assert raw[500:502].max() > 0.75  # the break, and the step after it


def test_a_value_beyond_the_range_is_novel() -> None:
    x = _pattern(400)
    x[350] = 40.0  # far above the probation's range: bins and facts never seen
    raw = cad_scores(x, 0.0, 3.0)
    assert raw[350] > 0.4
    below = _pattern(400)
    below[350] = -40.0
    assert cad_scores(below, 0.0, 3.0)[350] > 0.4


def test_scores_are_causal_a_prefix_scores_the_same() -> None:
    rng = np.random.default_rng(3)
    x = np.round(rng.normal(size=500), 1)
    whole = cad_scores(x, *probation_range(x, 75))
    prefix = cad_scores(x[:300], *probation_range(x[:300], 75))
    assert np.array_equal(whole[:300], prefix)


def test_rest_period_silences_scores_after_a_high_one_like_nab() -> None:
    raw = np.array([0.1, 0.2, 0.9, 0.3, 0.4, 0.5, 0.6])
    # NAB's history starts with a 1.0: the first `rest` points return 0.
    assert rest_filter(raw, 0.75, 2).tolist() == [0.0, 0.0, 0.9, 0.0, 0.0, 0.5, 0.6]
    cad = CadOse(0.0, 3.0, rest=2)
    returned = [cad.update(v) for v in _pattern(60)]
    assert returned == rest_filter(cad_scores(_pattern(60), 0.0, 3.0), 0.75, 2).tolist()


def test_memory_is_bounded() -> None:
    rng = np.random.default_rng(0)
    cad = CadOse(0.0, 1.0, max_contexts=50)
    for v in rng.random(2000):
        cad.update(float(v))
    assert cad.memory.n <= 50


def test_bad_range_is_refused() -> None:
    with pytest.raises(DetectorError, match="finite range"):
        CadOse(1.0, 0.0)


def test_combination_rules() -> None:
    a = np.zeros(100, dtype=bool)
    b = np.zeros(100, dtype=bool)
    a[[10, 60]] = True
    b[[12, 90]] = True
    probation = 20  # at most one alarm per 5 points
    assert np.flatnonzero(combine(a, b, RECORD, probation)).tolist() == [10, 60]
    assert np.flatnonzero(combine(a, b, CAD, probation)).tolist() == [12, 90]
    assert np.flatnonzero(combine(a, b, EITHER, probation)).tolist() == [10, 60, 90]
    # Both: the second family confirms within 5 points; 60 and 90 stand alone.
    assert np.flatnonzero(combine(a, b, BOTH, probation)).tolist() == [12]
