"""The season of a series: the lag at which it best repeats itself, from a sample."""

from __future__ import annotations

import numpy as np


def season_length(sample: np.ndarray, min_corr: float = 0.8, min_lag: int = 4) -> int:
    """The lag of the sample's strongest autocorrelation past its first negative value.

    Lags run up to half the sample; the autocorrelation is the unbiased estimate (each lag's
    sum divided by its number of pairs), so a clean season of a third of the sample scores
    near 1. Returns 0 when that correlation does not reach ``min_corr`` (no season).

    >>> t = np.arange(600)
    >>> season_length(np.sin(2 * np.pi * t / 96))
    96
    >>> season_length(np.random.default_rng(0).normal(size=600))
    0
    """
    x = np.asarray(sample, dtype=float)
    n = len(x)
    x = x - x.mean() if n else x
    if n < 4 * min_lag or not np.any(x):
        return 0
    spectrum = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
    acf = acf / acf[0] * n / (n - np.arange(n))
    half = n // 2
    negative = np.flatnonzero(acf[min_lag:half] < 0)
    if not len(negative):
        return 0
    start = min_lag + int(negative[0])
    lag = start + int(np.argmax(acf[start:half]))
    return lag if acf[lag] >= min_corr else 0
