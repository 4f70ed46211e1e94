"""Learned multivariate scorers: a model of healthy per-rank vectors, every rank scored at once.

``LearnedScorer`` keeps each rank's latest value of every feature (GPU scrapes and step
reports arrive apart), scores each rank once a step, for all ranks in one model call, and
turns scores into findings with its own threshold: the ``q`` quantile of the scores it did
not flag, plus ``margin`` times that quantile's distance from their median (a rule that
works for any score's scale and offset, an isolation forest's 0.5 as a PCA error's 20;
by default no margin: the quantile, which bounds the rate of flagged healthy vectors at
1 - q), held ``persistence`` steps. It fits on ``min_fit`` healthy vectors (a quarter held out to
calibrate the threshold), then is frozen, or refitted every ``refit_every`` vectors it did
not flag. ``fit`` takes a separate healthy run instead; ``to_arrays``/``from_arrays``
save and load the fitted state as plain arrays (detectors.modelfile). A finding names the
features that made the score (each one's share of it).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from collector.types import Subject
from collector.vocabulary import canonical_name
from detectors._buffer import Stepwise
from detectors._layout import RankLayout, to_slots
from detectors._scaling import RobustScaler
from detectors.errors import DetectorError
from detectors.generic import watchable
from detectors.models import Model, build, restore
from detectors.peer import DEFAULT_FEATURES as PEER_FEATURES
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity

MODELS = ("pca", "isolation_forest", "autoencoder", "lstm_vae")


def learnable(name: str) -> bool:
    """Features a learned scorer takes when none are named: the peer features and every
    level the generic comparison would watch."""
    return name in PEER_FEATURES or watchable(name)


class LearnedScorer(Stepwise):
    """Fires ``multivariate`` on ranks whose feature vector the healthy model cannot explain.

    Args:
        model: "pca", "isolation_forest", "autoencoder" or "lstm_vae".
        features: the vector's features (aliases allowed); None: the learnable features
            seen in the first ``warmup`` observations.
        q, margin: the threshold: the q quantile of unflagged scores plus margin times its
            distance from their median.
        window: vectors kept for fitting; min_fit: vectors before the first fit.
        refit_every: unflagged vectors between refits; 0 keeps the first fit (frozen).
        history: unflagged scores kept for the threshold.
        persistence, clear: steps a rank must be flagged to fire, calm to fire again.
        warmup: steps after a (re)launch in which a rank is neither learnt nor scored.
        per_step: most vectors of one step taken for fitting and the history (a step of
            100k ranks must not fill the window with one moment).
        model_params: the model's own parameters.

    Raises:
        DetectorError: a configuration that could never fire (see ``_check``).
    """

    kind = "multivariate"
    # Per-rank state (set by _fresh_ranks, grown by _grow): latest values, windows, counts.
    _last: np.ndarray
    _ring: np.ndarray
    _filled: np.ndarray
    _step: np.ndarray
    _count: np.ndarray
    _quiet: np.ndarray
    _fired: np.ndarray

    def __init__(
        self,
        model: str = "pca",
        features: Sequence[str] | None = None,
        q: float = 0.999,
        margin: float = 0.0,
        window: int = 4096,
        min_fit: int = 512,
        refit_every: int = 0,
        history: int = 4096,
        persistence: int = 2,
        clear: int = 10,
        warmup: int = 20,
        per_step: int = 256,
        model_params: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.model_kind, self.q, self.margin = model, q, margin
        self.window, self.min_fit, self.refit_every = window, min_fit, refit_every
        self.history, self.persistence, self.clear = history, persistence, clear
        self.warmup, self.per_step = warmup, per_step
        self.model_params = dict(model_params or {})
        self.name = name or model
        self._check()
        self.features: list[str] = [canonical_name(f) for f in features or ()]
        self._fixed = features is not None
        self.steps = int(self.model_params.get("window", 1)) if model == "lstm_vae" else 1
        self.scaler: RobustScaler | None = None
        self.model_: Model | None = None
        self.scores: deque[float] = deque(maxlen=history)
        self._rows: deque[np.ndarray] = deque(maxlen=window)
        self._since_fit = 0
        self._seen_batches = 0
        self._rng = np.random.default_rng(0)
        self._fresh_ranks()
        self.last_scores: tuple[np.ndarray, np.ndarray, float] | None = None

    def _check(self) -> None:
        """Refuses, at start, a configuration that could never fire."""
        problems = []
        if self.model_kind not in MODELS:
            problems.append(f"unknown model {self.model_kind!r}; known: {', '.join(MODELS)}")
        if not 0.5 <= self.q < 1.0:
            problems.append(f"q must be in [0.5, 1), got {self.q}")
        if self.margin < 0:
            problems.append(f"margin must be >= 0, got {self.margin}")
        if self.min_fit > self.window:
            problems.append(f"min_fit ({self.min_fit}) exceeds window ({self.window})")
        if self.min_fit < 16:
            problems.append(f"min_fit must be at least 16 vectors, got {self.min_fit}")
        if self.history < self.needed():
            problems.append(
                f"history ({self.history}) holds fewer scores than the q={self.q} quantile "
                f"needs ({self.needed()}): the threshold would never be set"
            )
        if self.refit_every < 0 or self.persistence < 1 or self.per_step < 1:
            problems.append("refit_every must be >= 0, persistence and per_step >= 1")
        if problems:
            raise DetectorError(f"learned scorer {self.name!r}: " + "; ".join(problems))

    def needed(self) -> int:
        """Unflagged scores the threshold needs before any finding: 1 / (1 - q)."""
        return int(math.ceil(1.0 / (1.0 - self.q)))

    def threshold(self) -> float:
        """The current bar (infinite until enough unflagged scores are kept)."""
        if len(self.scores) < self.needed():
            return math.inf
        arr = np.fromiter(self.scores, dtype=float)
        top, mid = float(np.quantile(arr, self.q)), float(np.median(arr))
        return top + self.margin * max(top - mid, 0.0)

    # -- the stream ---------------------------------------------------------------------

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        self.last_scores = None
        rows, windows = self._windows(batch)
        if not len(rows):
            return ()
        if self.model_ is None:
            self._collect(windows)
            return ()
        scores = self.model_.score(self.scaler.transform(windows))  # type: ignore[union-attr]
        limit = self.threshold()
        flagged = scores > limit
        self._keep(scores[~flagged], windows[~flagged])
        return self._judge(rows, windows, scores, flagged, limit, batch)

    def scored(self) -> list[tuple[int, float]]:
        """The ranks scored in the last step and their scores (for ``--scores``)."""
        if self.last_scores is None:
            return []
        rows, scores, _ = self.last_scores
        ranks = self._layout.ranks[rows]
        return [(int(r), float(s)) for r, s in zip(ranks, scores, strict=True)]

    # -- vectors -----------------------------------------------------------------------

    def _windows(self, batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
        """Slots scored this step (each once a step) and their windows of raw vectors."""
        self._seen_batches += 1
        if not self._fixed and self._seen_batches <= max(self.warmup, 1) * 2:
            self._grow_features(f for f in batch.features if learnable(f))
        if not self.features:
            return np.zeros(0, dtype=np.int64), np.zeros((0, self.steps, 0))
        slots = self._layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
        size = len(self._layout.ranks)
        self._grow(size)
        cols = [batch.features.index(f) if f in batch.features else -1 for f in self.features]
        for j, c in enumerate(cols):
            if c >= 0:
                x = to_slots(batch.values[:, c], slots, size)
                self._last[np.isfinite(x), j] = x[np.isfinite(x)]
        here = to_slots(np.ones(len(batch.ranks)), slots, size) > 0
        warm = np.ones(size, dtype=bool)
        if "since_launch" in batch.features:
            warm = to_slots(batch.column("since_launch"), slots, size) >= self.warmup
            self._filled[~warm & here] = 0
        new_step = here & (batch.step > self._step)
        self._step[here] = np.maximum(self._step[here], batch.step)
        rows = np.flatnonzero(new_step & warm & np.isfinite(self._last).all(axis=1))
        self._ring[rows] = np.roll(self._ring[rows], -1, axis=1)
        self._ring[rows, -1] = self._last[rows]
        self._filled[rows] += 1
        rows = rows[self._filled[rows] >= self.steps]
        return rows, self._ring[rows]

    def _grow_features(self, names: Iterable[str]) -> None:
        new = [n for n in names if n not in self.features]
        if not new or self.model_ is not None:
            return
        self.features += new
        extra = len(new)
        self._last = np.pad(self._last, ((0, 0), (0, extra)), constant_values=np.nan)
        self._ring = np.pad(self._ring, ((0, 0), (0, 0), (0, extra)))
        self._rows.clear()

    def _grow(self, size: int) -> None:
        extra = size - len(self._last)
        if extra <= 0:
            return
        self._last = np.pad(self._last, ((0, extra), (0, 0)), constant_values=np.nan)
        self._ring = np.pad(self._ring, ((0, extra), (0, 0), (0, 0)))
        for name in ("_filled", "_count", "_quiet"):
            setattr(self, name, np.pad(getattr(self, name), (0, extra)))
        self._step = np.pad(self._step, (0, extra), constant_values=-np.inf)
        self._fired = np.pad(self._fired, (0, extra))

    # -- fitting and the threshold ------------------------------------------------------

    def _sample(self, windows: np.ndarray) -> np.ndarray:
        if len(windows) <= self.per_step:
            return windows
        return windows[self._rng.choice(len(windows), self.per_step, replace=False)]

    def _collect(self, windows: np.ndarray) -> None:
        self._rows.extend(self._sample(windows))
        if len(self._rows) >= self.min_fit:
            self.fit_windows(np.stack(self._rows))

    def reset_stream(self) -> None:
        """Forgets the ranks seen (a fitted scorer about to read another run)."""
        self._fresh_ranks()
        self._seen_batches = 10**9  # the features are fixed by the fit

    def _fresh_ranks(self) -> None:
        self._layout = RankLayout()
        self._last = np.zeros((0, len(self.features)))
        self._ring = np.zeros((0, self.steps, len(self.features)))
        self._filled = np.zeros(0, dtype=np.int64)
        self._step = np.full(0, -np.inf)
        self._count = np.zeros(0, dtype=np.int64)
        self._quiet = np.zeros(0, dtype=np.int64)
        self._fired = np.zeros(0, dtype=bool)

    def fit_windows(self, windows: np.ndarray) -> LearnedScorer:
        """Fits on healthy windows (rows x steps x features): three quarters fit the scaler
        and the model, the last quarter's scores start the threshold's history."""
        order = self._rng.permutation(len(windows))
        cut = max(int(0.75 * len(windows)), 1)
        fit, calib = windows[order[:cut]], windows[order[cut:]]
        self.scaler = RobustScaler().fit(fit[:, -1])
        if not self.scaler.kept_.any():
            raise DetectorError(f"learned scorer {self.name!r}: no feature moved while fitting")
        self.model_ = build(self.model_kind, self.model_params).fit(self.scaler.transform(fit))
        self.scores.clear()
        if len(calib):
            self.scores.extend(self.model_.score(self.scaler.transform(calib)).tolist())
        self._since_fit = 0
        return self

    def _keep(self, scores: np.ndarray, windows: np.ndarray) -> None:
        """Unflagged scores feed the threshold; in refit mode their vectors the next fit."""
        pick = self._rng.permutation(len(scores))[: self.per_step]
        self.scores.extend(scores[pick].tolist())
        if self.refit_every:
            self._rows.extend(windows[pick])
            self._since_fit += len(pick)
            if self._since_fit >= self.refit_every and len(self._rows) >= self.min_fit:
                history = list(self.scores)
                self.fit_windows(np.stack(self._rows))
                self.scores.extend(history)

    # -- findings -----------------------------------------------------------------------

    def _judge(
        self,
        rows: np.ndarray,
        windows: np.ndarray,
        scores: np.ndarray,
        flagged: np.ndarray,
        limit: float,
        batch: StepBatch,
    ) -> list[Finding]:
        self.last_scores = (rows, scores, limit)
        self._count[rows] = (self._count[rows] + 1) * flagged
        self._quiet[rows] = (self._quiet[rows] + 1) * ~flagged
        self._fired[rows] &= self._quiet[rows] < self.clear
        new = flagged & (self._count[rows] >= self.persistence) & ~self._fired[rows]
        if not new.any():
            return []
        self._fired[rows[new]] = True
        assert self.scaler is not None
        assert self.model_ is not None
        shares = self.model_.contributions(self.scaler.transform(windows[new]))
        names = self.scaler.kept_names(self.features)
        return [
            self._finding(int(slot), float(score), limit, share, window[-1], names, batch)
            for slot, score, share, window in zip(
                rows[new], scores[new], shares, windows[new], strict=True
            )
        ]

    def _finding(
        self,
        slot: int,
        score: float,
        limit: float,
        share: np.ndarray,
        values: np.ndarray,
        names: list[str],
        batch: StepBatch,
    ) -> Finding:
        lay = self._layout
        subject = Subject(
            int(lay.replicas[slot]), int(lay.ranks[slot]), str(lay.nodes[slot]) or None
        )
        evidence = {"score": score, "threshold": limit}
        total = float(share.sum()) or 1.0
        kept = np.flatnonzero(self.scaler.kept_)  # type: ignore[union-attr]
        for j in np.argsort(share)[::-1][:3]:  # the features that made the score
            feature = names[j]
            evidence[feature] = float(values[kept[j]])
            evidence[f"{feature}_share"] = float(share[j]) / total
        return Finding(
            self.kind, subject, score, Severity.WARN, batch.time, batch.step, evidence, self.name
        )

    # -- saving -------------------------------------------------------------------------

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as named arrays (the scaler, the model, the threshold's
        history) and a JSON record of the configuration."""
        if self.model_ is None or self.scaler is None:
            raise DetectorError(f"learned scorer {self.name!r} is not fitted; nothing to save")
        meta = {
            "name": self.name,
            "model": self.model_kind,
            "features": self.features,
            "q": self.q,
            "margin": self.margin,
            "persistence": self.persistence,
            "warmup": self.warmup,
            "model_params": self.model_params,
        }
        out = {f"scaler/{k}": v for k, v in self.scaler.to_arrays().items()}
        out |= {f"model/{k}": v for k, v in self.model_.to_arrays().items()}
        out["history"] = np.fromiter(self.scores, dtype=float)
        out["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], **overrides: Any) -> LearnedScorer:
        """A fitted, frozen scorer from ``to_arrays`` (``overrides``: e.g. refit_every)."""
        meta = json.loads(bytes(np.asarray(arrays["meta"], dtype=np.uint8)).decode())
        params = {
            k: meta[k]
            for k in (
                "model",
                "features",
                "q",
                "margin",
                "persistence",
                "warmup",
                "model_params",
                "name",
            )
        }
        scorer = cls(**{**params, **overrides})
        scaler = {k[7:]: v for k, v in arrays.items() if k.startswith("scaler/")}
        model = {k[6:]: v for k, v in arrays.items() if k.startswith("model/")}
        scorer.scaler = RobustScaler.from_arrays(scaler)
        scorer.model_ = restore(meta["model"], model)
        scorer.scores.extend(np.asarray(arrays["history"], dtype=float).tolist())
        return scorer


def _factory(model: str, registry_name: str):  # type: ignore[no-untyped-def]
    def make(**params: Any) -> LearnedScorer:
        return LearnedScorer(model, name=params.pop("name", registry_name), **params)

    make.__doc__ = f"A LearnedScorer with the {model} model (kind ``multivariate``)."
    return make


isolation_forest = _factory("isolation_forest", "isolation_forest")
pca_reconstruction = _factory("pca", "pca_reconstruction")
autoencoder = _factory("autoencoder", "autoencoder")
lstm_vae = _factory("lstm_vae", "lstm_vae")
