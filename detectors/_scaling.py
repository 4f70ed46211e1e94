"""Robust scaling for the learned scorers, safe with metrics that were flat while fitting.

Each feature is centred on its median and divided by a robust spread: the MAD's standard
deviation, else the interquartile range's, floored at 1 % of the median's size and at a
tiny absolute amount. A feature that did not move at all while fitting carries nothing
learnable and is left out of the model (a rule or the generic peer comparison watches its
change); every scaled value is clipped at ``clip``, so one feature can weigh at most
``clip`` spreads in a score, never 1e18 of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


class RobustScaler:
    """Fitted per-feature centres and spreads; ``kept`` marks the features that moved."""

    def __init__(self, clip: float = 10.0) -> None:
        self.clip = clip
        self.center_ = np.zeros(0)
        self.spread_ = np.ones(0)
        self.kept_ = np.zeros(0, dtype=bool)

    def fit(self, x: np.ndarray) -> RobustScaler:
        """Fits on rows ``x`` (rows x features, finite)."""
        center = np.median(x, axis=0)
        mad = 1.4826 * np.median(np.abs(x - center), axis=0)
        q1, q3 = np.percentile(x, [25, 75], axis=0)
        spread = np.where(mad > 0, mad, (q3 - q1) / 1.349)
        self.spread_ = np.maximum(spread, np.maximum(0.01 * np.abs(center), 1e-9))
        self.center_ = center
        self.kept_ = x.max(axis=0) > x.min(axis=0)
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        """Scaled, clipped values of the kept features (the last axis is the features')."""
        z = (x - self.center_) / self.spread_
        clipped: np.ndarray = np.clip(z, -self.clip, self.clip)[..., self.kept_]
        return clipped

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "center": self.center_,
            "spread": self.spread_,
            "kept": self.kept_,
            "clip": np.array([self.clip]),
        }

    @classmethod
    def from_arrays(cls, a: Mapping[str, np.ndarray]) -> RobustScaler:
        scaler = cls(float(np.asarray(a["clip"])[0]))
        scaler.center_ = np.asarray(a["center"], dtype=float)
        scaler.spread_ = np.asarray(a["spread"], dtype=float)
        scaler.kept_ = np.asarray(a["kept"], dtype=bool)
        return scaler

    def kept_names(self, features: Sequence[str]) -> list[str]:
        return [f for f, k in zip(features, self.kept_, strict=True) if k]
