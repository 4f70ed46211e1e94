"""The fast medians of the vectorised detectors give np.median's numbers bit for bit (a
different number, even -0.0 for 0.0 or one rounding apart, could change a finding)."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors._median import median, median_columns
from detectors._peercore import nanmedian_columns
from detectors.trend import _row_medians

# Values that stress a median: both zeros, infinities, the largest floats (whose sum
# overflows), ties and a value one rounding from another.
AWKWARD = [0.0, -0.0, 1.0, -1.0, 3.0, 3.0000000000000004, np.inf, -np.inf, 1e308, 1.7e308]


def _arrays(columns: int | None = None) -> st.SearchStrategy[np.ndarray]:
    value = st.one_of(st.sampled_from([*AWKWARD, np.nan]), st.floats(-1e3, 1e3))
    width = st.integers(1, 4) if columns is None else st.just(columns)
    return st.tuples(st.integers(1, 40), width).flatmap(
        lambda shape: st.lists(
            value, min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]
        ).map(lambda v: np.array(v).reshape(shape))
    )


def _bits(a: object) -> bytes:
    return np.asarray(a, dtype=float).tobytes()


def _sorted_nanmedian(x: np.ndarray) -> np.ndarray:
    """The definition: the middle of each column's non-NaN values after a sort."""
    ordered = np.sort(x, axis=0)  # NaN sorts last
    count = (~np.isnan(x)).sum(axis=0)
    cols = np.arange(x.shape[1])
    low = ordered[np.maximum((count - 1) // 2, 0), cols]
    high = ordered[np.maximum(count // 2, 0), cols]
    return np.where(count > 0, (low + high) / 2.0, np.nan)


@settings(max_examples=200, deadline=None)
@given(_arrays())
def test_median_and_median_columns_are_np_median(x: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf - inf, sums past the largest
        assert _bits(median_columns(x)) == _bits(np.median(x, axis=0))
        assert _bits(median(x[:, 0])) == _bits(np.median(x[:, 0]))
        assert _bits(median_columns(np.asfortranarray(x))) == _bits(np.median(x, axis=0))


@settings(max_examples=200, deadline=None)
@given(_arrays(), st.booleans())
def test_nanmedian_columns_is_the_sorted_middle(x: np.ndarray, nan_seen: bool) -> None:
    """With a NaN (or ``nan_seen``: one in columns taken with these) the columns' medians
    are the middle of their sorted values; without, np.median's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = _sorted_nanmedian(x) if nan_seen or np.isnan(x).any() else np.median(x, axis=0)
        assert _bits(nanmedian_columns(np.asfortranarray(x), nan_seen)) == _bits(expected)


@settings(max_examples=200, deadline=None)
@given(_arrays(columns=4))
def test_row_medians_of_four_are_np_median(x: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, expected = _row_medians(x), np.median(x, axis=1)
    assert (np.isnan(got) == np.isnan(expected)).all()  # a NaN's bits are not a number's
    assert _bits(got[~np.isnan(got)]) == _bits(expected[~np.isnan(expected)])


def test_large_arrays_take_the_fast_path_and_agree() -> None:
    rng = np.random.default_rng(0)
    for n in (100_000, 100_001, 8192):
        x = rng.normal(size=(n, 3)).round(2)  # ties, and zeros of one sign
        assert _bits(median_columns(x)) == _bits(np.median(x, axis=0))
        assert _bits(median(x[:, 1])) == _bits(np.median(x[:, 1]))
        x[n // 2, 0] = -0.0  # a -0.0 goes to np.median itself
        assert _bits(median_columns(x)) == _bits(np.median(x, axis=0))
