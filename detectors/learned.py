"""Learned multivariate scorers over per-rank feature vectors, run online by an adapter.

The batch models (scikit-learn's IsolationForest, PCA reconstruction error, a small torch
autoencoder as Minder uses) are fitted on windows of healthy frames. ``WindowedBatch``
makes any of them a StreamingDetector: it keeps the last ``window`` frames learnt, refits
every ``refit_every`` of them and scores a frame with the latest fit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from collector.types import Frame
from collector.vocabulary import canonical_name
from detectors.errors import DetectorError
from detectors.gates import QuantileGate


class _Standardised:
    def _standardise_fit(self, x: np.ndarray) -> np.ndarray:
        self.mean_ = x.mean(axis=0)
        self.scale_ = np.maximum(x.std(axis=0), 1e-9)
        return self._standardise(x)

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        z: np.ndarray = (x - self.mean_) / self.scale_
        return z


class IsolationForestModel(_Standardised):
    """Isolation forest; score = negated ``score_samples`` (higher = more anomalous)."""

    def __init__(self, n_estimators: int = 64, seed: int = 0) -> None:
        self.n_estimators, self.seed = n_estimators, seed

    def fit(self, x: np.ndarray) -> IsolationForestModel:
        from sklearn.ensemble import IsolationForest

        self.model_ = IsolationForest(n_estimators=self.n_estimators, random_state=self.seed)
        self.model_.fit(self._standardise_fit(x))
        return self

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        return -np.asarray(self.model_.score_samples(self._standardise(x)))


class PCAModel(_Standardised):
    """Reconstruction error after projecting on the top principal components."""

    def __init__(self, n_components: float = 0.95) -> None:
        self.n_components = n_components

    def fit(self, x: np.ndarray) -> PCAModel:
        from sklearn.decomposition import PCA

        z = self._standardise_fit(x)
        self.model_ = PCA(n_components=self.n_components, svd_solver="full").fit(z)
        return self

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        z = self._standardise(x)
        back = self.model_.inverse_transform(self.model_.transform(z))
        return np.asarray(((z - back) ** 2).sum(axis=1))


class AutoencoderModel(_Standardised):
    """A small torch autoencoder (Minder's idea); score = reconstruction error."""

    def __init__(self, hidden: int = 8, epochs: int = 60, lr: float = 0.01, seed: int = 0) -> None:
        self.hidden, self.epochs, self.lr, self.seed = hidden, epochs, lr, seed

    def fit(self, x: np.ndarray) -> AutoencoderModel:
        import torch

        torch.manual_seed(self.seed)
        z = torch.as_tensor(self._standardise_fit(x), dtype=torch.float32)
        width = z.shape[1]
        bottleneck = max(1, min(self.hidden, width - 1))
        self.model_ = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width),
            torch.nn.Tanh(),
            torch.nn.Linear(2 * width, bottleneck),
            torch.nn.Tanh(),
            torch.nn.Linear(bottleneck, width),
        )
        optimiser = torch.optim.Adam(self.model_.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            optimiser.zero_grad()
            loss = ((self.model_(z) - z) ** 2).mean()
            loss.backward()
            optimiser.step()
        return self

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            z = torch.as_tensor(self._standardise(x), dtype=torch.float32)
            errors: np.ndarray = ((self.model_(z) - z) ** 2).sum(dim=1).numpy().astype(float)
            return errors


class WindowedBatch:
    """Runs a batch model in the stream: learn into a window, refit, score with the last fit.

    Args:
        model: a factory of models with ``fit(X)`` and ``decision_function(X)``.
        features: the named features that form the vector, in this order.
        window: frames kept for fitting.
        refit_every: learnt frames between fits.
        min_fit: frames needed before the first fit; scores are 0.0 until then.
    """

    def __init__(
        self,
        model: Callable[[], Any],
        features: Sequence[str],
        window: int = 512,
        refit_every: int = 256,
        min_fit: int = 64,
    ) -> None:
        if not features:
            raise DetectorError("WindowedBatch needs at least one feature name")
        if min_fit > window:
            raise DetectorError(f"min_fit ({min_fit}) cannot exceed window ({window})")
        self.model, self.features = model, tuple(canonical_name(f) for f in features)
        self.window, self.refit_every, self.min_fit = window, refit_every, min_fit
        self._rows: deque[np.ndarray] = deque(maxlen=window)
        self._since_fit = 0
        self.fitted_: Any = None

    def _vector(self, frame: Frame) -> np.ndarray | None:
        try:
            row = np.array([frame.values[f] for f in self.features], dtype=float)
        except KeyError:
            return None
        return row if np.isfinite(row).all() else None

    def learn_one(self, frame: Frame) -> None:
        row = self._vector(frame)
        if row is None:
            return
        self._rows.append(row)
        self._since_fit += 1
        due = self.fitted_ is None or self._since_fit >= self.refit_every
        if due and len(self._rows) >= self.min_fit:
            self.fitted_ = self.model().fit(np.stack(self._rows))
            self._since_fit = 0

    def score_one(self, frame: Frame) -> float:
        row = self._vector(frame)
        if row is None or self.fitted_ is None:
            return 0.0
        return float(self.fitted_.decision_function(row[None, :])[0])


#: The per-rank vector the learned scorers read by default.
DEFAULT_FEATURES = ("compute_ms", "data_wait_ms", "comm_ms", "gpu_temp", "sm_clock", "mem_used")


def _gated(
    model: Callable[[], Any],
    name: str,
    features: Sequence[str] | None,
    q: float,
    window: int,
    refit_every: int,
    min_fit: int,
    margin: float,
) -> QuantileGate:
    scorer = WindowedBatch(model, features or DEFAULT_FEATURES, window, refit_every, min_fit)
    return QuantileGate(scorer, q=q, kind="multivariate", name=name, warmup=min_fit, margin=margin)


def isolation_forest(
    features: Sequence[str] | None = None,
    q: float = 0.999,
    window: int = 512,
    refit_every: int = 256,
    min_fit: int = 64,
    margin: float = 1.5,
    n_estimators: int = 64,
) -> QuantileGate:
    """An IsolationForest scorer behind a quantile gate (kind ``multivariate``)."""
    return _gated(
        partial(IsolationForestModel, n_estimators),
        "isolation_forest",
        features,
        q,
        window,
        refit_every,
        min_fit,
        margin,
    )


def pca_reconstruction(
    features: Sequence[str] | None = None,
    q: float = 0.999,
    window: int = 512,
    refit_every: int = 256,
    min_fit: int = 64,
    margin: float = 1.5,
    n_components: float = 0.95,
) -> QuantileGate:
    """A PCA reconstruction-error scorer behind a quantile gate (kind ``multivariate``)."""
    return _gated(
        partial(PCAModel, n_components),
        "pca_reconstruction",
        features,
        q,
        window,
        refit_every,
        min_fit,
        margin,
    )


def autoencoder(
    features: Sequence[str] | None = None,
    q: float = 0.999,
    window: int = 512,
    refit_every: int = 256,
    min_fit: int = 64,
    margin: float = 1.5,
    hidden: int = 3,
    epochs: int = 60,
) -> QuantileGate:
    """A small torch autoencoder behind a quantile gate (kind ``multivariate``)."""
    return _gated(
        partial(AutoencoderModel, hidden, epochs),
        "autoencoder",
        features,
        q,
        window,
        refit_every,
        min_fit,
        margin,
    )
