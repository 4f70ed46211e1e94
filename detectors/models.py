"""Learned models of healthy feature vectors, as plain arrays: nothing here is pickled.

Every model scores a batch of windows ``(rows, T, features)`` of robustly scaled values
(``T`` = 1 for the point-wise ones, which read the last step), higher = more anomalous,
and says how much each feature contributed (``contributions``, rows x features, summing to
each row's score or, for the isolation forest, to the score each feature's removal
takes away). ``to_arrays`` and ``from_arrays`` round-trip a fitted model through a dict of
numpy arrays, so a model file is data, never code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np


class Model(Protocol):
    kind: str
    window: int

    def fit(self, x: np.ndarray) -> Model: ...

    def score(self, x: np.ndarray) -> np.ndarray: ...

    def contributions(self, x: np.ndarray) -> np.ndarray: ...

    def to_arrays(self) -> dict[str, np.ndarray]: ...


class PCAModel:
    """Squared reconstruction error off the principal components that hold ``variance``."""

    kind, window = "pca", 1

    def __init__(self, variance: float = 0.95) -> None:
        self.variance = variance
        self.components_ = np.zeros((0, 0))
        self.mean_ = np.zeros(0)

    def fit(self, x: np.ndarray) -> PCAModel:
        z = x[:, -1]
        self.mean_ = z.mean(axis=0)
        _, sing, vt = np.linalg.svd(z - self.mean_, full_matrices=False)
        share = np.cumsum(sing**2) / max(float((sing**2).sum()), 1e-12)
        keep = min(int(np.searchsorted(share, self.variance)) + 1, max(z.shape[1] - 1, 1))
        self.components_ = vt[:keep]
        return self

    def contributions(self, x: np.ndarray) -> np.ndarray:
        z = x[:, -1] - self.mean_
        back = z @ self.components_.T @ self.components_
        residual: np.ndarray = (z - back) ** 2
        return residual

    def score(self, x: np.ndarray) -> np.ndarray:
        total: np.ndarray = self.contributions(x).sum(axis=1)
        return total

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"components": self.components_, "mean": self.mean_}

    @classmethod
    def from_arrays(cls, a: Mapping[str, np.ndarray]) -> PCAModel:
        model = cls()
        model.components_ = np.asarray(a["components"], dtype=float)
        model.mean_ = np.asarray(a["mean"], dtype=float)
        return model


def _c(n: np.ndarray | float) -> np.ndarray:
    """Average path length of an unsuccessful search in a binary tree of n points."""
    n = np.asarray(n, dtype=float)
    harmonic = np.log(np.maximum(n - 1.0, 1.0)) + 0.5772156649
    return np.where(
        n > 2, 2.0 * harmonic - 2.0 * (n - 1.0) / np.maximum(n, 1.0), np.where(n == 2, 1.0, 0.0)
    )


class IsolationForestModel:
    """Liu et al.'s isolation forest, in arrays: score 2^(-E[path] / c(sample)), in (0, 1).

    Each tree is four arrays over its nodes (split feature, split value, children, and the
    points a leaf holds), so all rows descend all trees at once.
    """

    kind, window = "isolation_forest", 1

    def __init__(self, trees: int = 100, sample: int = 256, seed: int = 0) -> None:
        self.trees, self.sample, self.seed = trees, sample, seed
        self.feature_ = np.zeros((0, 0), dtype=np.int64)
        self.split_ = np.zeros((0, 0))
        self.left_ = np.zeros((0, 0), dtype=np.int64)
        self.size_ = np.zeros((0, 0))
        self.psi_ = 1.0

    def fit(self, x: np.ndarray) -> IsolationForestModel:
        z, rng = x[:, -1], np.random.default_rng(self.seed)
        psi = min(self.sample, len(z))
        depth = max(int(math.ceil(math.log2(max(psi, 2)))), 1)
        nodes = 2 ** (depth + 1) - 1  # a full tree of that depth, leaves padded
        shape = (self.trees, nodes)
        self.feature_, self.split_ = np.full(shape, -1, dtype=np.int64), np.zeros(shape)
        self.left_, self.size_ = np.full(shape, -1, dtype=np.int64), np.zeros(shape)
        for t in range(self.trees):
            self._grow(t, z[rng.choice(len(z), psi, replace=False)], depth, rng)
        self.psi_ = float(psi)
        return self

    def _grow(self, t: int, pts: np.ndarray, depth: int, rng: np.random.Generator) -> None:
        stack = [(0, pts, 0)]
        while stack:
            node, here, level = stack.pop()
            self.size_[t, node] = len(here)
            if level >= depth or len(here) <= 1:
                continue
            spans = here.max(axis=0) - here.min(axis=0)
            usable = np.flatnonzero(spans > 0)
            if not len(usable):
                continue
            f = int(rng.choice(usable))
            cut = float(rng.uniform(here[:, f].min(), here[:, f].max()))
            self.feature_[t, node], self.split_[t, node] = f, cut
            self.left_[t, node] = 2 * node + 1
            go = here[:, f] < cut
            stack += [(2 * node + 1, here[go], level + 1), (2 * node + 2, here[~go], level + 1)]

    def _path(self, z: np.ndarray) -> np.ndarray:
        """Mean path length of every row over every tree, all trees descended at once."""
        trees = np.arange(self.trees)[None, :]
        rows = np.arange(len(z))[:, None]
        node = np.zeros((len(z), self.trees), dtype=np.int64)
        length = np.zeros(node.shape)
        for _ in range(self.feature_.shape[1]):
            feat = self.feature_[trees, node]
            inner = feat >= 0
            if not inner.any():
                break
            go_left = z[rows, np.maximum(feat, 0)] < self.split_[trees, node]
            node = np.where(inner, np.where(go_left, 2 * node + 1, 2 * node + 2), node)
            length += inner
        total: np.ndarray = (length + _c(self.size_[trees, node])).mean(axis=1)
        return total

    def score(self, x: np.ndarray) -> np.ndarray:
        result: np.ndarray = 2.0 ** (-self._path(x[:, -1]) / max(float(_c(self.psi_)), 1e-12))
        return result

    def contributions(self, x: np.ndarray) -> np.ndarray:
        """What setting each feature to its healthy median (0 when scaled) takes away."""
        base, out = self.score(x), np.zeros((len(x), x.shape[2]))
        for j in range(x.shape[2]):
            muted = x.copy()
            muted[:, -1, j] = 0.0
            out[:, j] = np.maximum(base - self.score(muted), 0.0)
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "feature": self.feature_,
            "split": self.split_,
            "left": self.left_,
            "size": self.size_,
            "psi": np.array([self.psi_]),
        }

    @classmethod
    def from_arrays(cls, a: Mapping[str, np.ndarray]) -> IsolationForestModel:
        model = cls(trees=int(np.asarray(a["feature"]).shape[0]))
        model.feature_ = np.asarray(a["feature"], dtype=np.int64)
        model.split_ = np.asarray(a["split"], dtype=float)
        model.left_ = np.asarray(a["left"], dtype=np.int64)
        model.size_ = np.asarray(a["size"], dtype=float)
        model.psi_ = float(np.asarray(a["psi"])[0])
        return model


def _kinds() -> dict[str, Any]:
    from detectors.models_torch import AutoencoderModel, LSTMVAEModel

    return {
        "pca": PCAModel,
        "isolation_forest": IsolationForestModel,
        "autoencoder": AutoencoderModel,
        "lstm_vae": LSTMVAEModel,
    }


def _kind(kind: str) -> Any:
    kinds = _kinds()
    if kind not in kinds:
        raise ValueError(f"unknown model {kind!r}; known: {', '.join(kinds)}")
    return kinds[kind]


def build(kind: str, params: Mapping[str, Any] | None = None) -> Model:
    """A fresh model of a kind, with its parameters."""
    model: Model = _kind(kind)(**dict(params or {}))
    return model


def restore(kind: str, arrays: Mapping[str, np.ndarray]) -> Model:
    """A fitted model of a kind from its arrays (``to_arrays``)."""
    model: Model = _kind(kind).from_arrays(arrays)
    return model
