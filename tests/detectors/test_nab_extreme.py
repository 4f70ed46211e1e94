"""The new-extreme trigger for NAB: a value beyond every earlier value's range."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_extreme import ExtremeRecordFamily, new_extreme_flags
from detectors.univariate import RecordDetector

PROBATION = 150


def _series() -> np.ndarray:
    rng = np.random.default_rng(2)
    x = np.sin(np.arange(1400) / 5.0) + 0.05 * rng.normal(size=1400)
    x[400] -= 30.0  # a deep dip: the record the detector must beat for 4 probations
    x[900] = 3.5  # a new maximum, by about 2.4 (0.08 of the range of about 31 before)
    return x


def test_a_new_maximum_under_the_record_is_found_by_the_trigger_only() -> None:
    x = _series()
    record = np.flatnonzero(RecordDetector().detect(x, PROBATION).flags).tolist()
    assert 400 in record
    assert 900 not in record
    assert np.flatnonzero(new_extreme_flags(x, PROBATION, 0.05)).tolist() == [400, 900]
    # A margin above the new maximum's excess leaves only the first spike.
    assert np.flatnonzero(new_extreme_flags(x, PROBATION, 0.2)).tolist() == [400]
    assert not new_extreme_flags(x, PROBATION, math.inf).any()


def test_nothing_in_the_probation_and_one_flag_a_quarter_probation() -> None:
    x = np.arange(1000.0)  # a new maximum at every point
    flags = np.flatnonzero(new_extreme_flags(x, PROBATION, 0.0))
    assert flags[0] == PROBATION
    assert np.all(np.diff(flags) == PROBATION // 4 + 1)


def test_bad_input_is_refused_with_a_reason() -> None:
    x = _series()
    with pytest.raises(DetectorError, match="margin"):
        new_extreme_flags(x, PROBATION, -0.1)
    x[5] = np.nan
    with pytest.raises(DetectorError, match="finite"):
        new_extreme_flags(x, PROBATION, 0.1)


def test_the_family_joins_the_trigger_to_the_record_detector() -> None:
    x = _series()
    f = NabFile("cat/f.csv", np.arange(len(x)).astype(str), x, ((880, 920),))
    family = ExtremeRecordFamily(margins=(math.inf, 0.05))
    shipped = (4.0, 3.0, 0.5, 4.0, 0.8, 0.25, 0.0)
    # NAB's probation for 1400 rows is 210: the spike at 400 is past it.
    off = np.flatnonzero(family.flags([f], (math.inf, *shipped))[0]).tolist()
    on = np.flatnonzero(family.flags([f], (0.05, *shipped))[0]).tolist()
    assert 900 not in off
    assert on == sorted({*off, 900})
    assert len(list(family.settings())) == 2 * 432
