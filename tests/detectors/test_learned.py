"""Learned scorers a user can rely on: they fire at their defaults, survive flat metrics,
refuse configurations that could never fire, keep a clean threshold history, name the
features behind a score, and save and load without unpickling anything."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from detectors.errors import DetectorError
from detectors.learned import MODELS, LearnedScorer
from detectors.modelfile import load_models, save_models
from detectors.registry import create
from tests.detectors._batches import batch

N = 32


def _steps(
    start: int,
    stop: int,
    seed: int = 0,
    broken: frozenset[int] = frozenset(),
    flat: float = 0.0,
    extreme: frozenset[int] = frozenset(),
):
    """Six features of ranks driven by three factors (b = 2a, d = a + c, f = -e); a broken
    rank breaks b's relation while each value stays ordinary; an extreme one has values far
    out. ``flat`` is a metric that never moved while healthy."""
    rng = np.random.default_rng(seed)
    for s in range(start, stop):
        a, c, e = rng.standard_normal((3, N))
        for r in extreme:
            a[r], c[r], e[r] = a[r] + 8.0, c[r] + 8.0, e[r] - 8.0
        noise = 0.05 * rng.standard_normal((3, N))
        b, d, f = 2 * a + noise[0], a + c + noise[1], -e + noise[2]
        for r in broken:
            b[r] = -2 * a[r]
        cols = {"a": a, "b": b, "c": c, "d": d, "e": e, "f": f}
        yield batch(s, {**cols, "flat": np.full(N, 7.0) + flat})


def _fitted(model: str, **params) -> LearnedScorer:
    features = ["a", "b", "c", "d", "e", "f", "flat"]
    det = LearnedScorer(model, features=features, warmup=0, min_fit=2048, **params)
    for b in _steps(0, 130):
        assert not det.process_step(b)
    assert det.model_ is not None
    return det


@pytest.mark.parametrize("model", MODELS)
def test_every_model_fires_at_its_defaults_and_names_the_broken_relation(model: str) -> None:
    params = {"model_params": {"window": 4}} if model == "lstm_vae" else {}
    det = _fitted(model, **params)
    # An isolation forest splits one feature at a time: it sees values out of range, not
    # broken relations between ordinary values (Liu et al.); the others see both.
    fault = (
        {"extreme": frozenset({5})} if model == "isolation_forest" else {"broken": frozenset({5})}
    )
    found = [f for b in _steps(130, 160, seed=1, **fault) for f in det.process_step(b)]
    if model == "lstm_vae":
        # It fires at its defaults, but on these independent steps not on the right rank:
        # a weakness measured, not hidden (docs/benchmarks.md, learned scorers).
        assert found
        return
    assert {f.subject.rank for f in found} == {5}
    top = max((k for k in found[0].evidence if k.endswith("_share")), key=found[0].evidence.get)
    moved = {"a", "b", "d"} if "broken" in fault else {"a", "b", "c", "d", "e", "f"}
    assert top.removesuffix("_share") in moved  # the features that made the score


def test_a_metric_flat_while_fitting_does_not_dominate_the_score() -> None:
    det = _fitted("pca")
    assert det.scaler is not None
    assert "flat" not in det.scaler.kept_names(det.features)  # it carried nothing
    # It wiggles now on every rank: no finding, however small its spread was (zero).
    assert not [f for b in _steps(130, 190, seed=2, flat=1e-3) for f in det.process_step(b)]
    scores = det.last_scores[1]  # type: ignore[index]
    assert float(np.max(scores)) < 1e3


def test_configurations_that_could_never_fire_are_refused_at_start() -> None:
    with pytest.raises(DetectorError, match="min_fit"):
        LearnedScorer("pca", min_fit=8192, window=4096)
    with pytest.raises(DetectorError, match="history"):
        LearnedScorer("isolation_forest", q=0.9999, history=4096)
    with pytest.raises(DetectorError, match="unknown model"):
        LearnedScorer("svm")
    with pytest.raises(DetectorError, match="bad parameters|min_fit"):
        create("isolation_forest", {"min_fit": 5000})


def test_flagged_scores_stay_out_of_the_threshold_s_history() -> None:
    det = _fitted("pca")
    before = det.threshold()
    for b in _steps(130, 330, seed=3, broken=frozenset({1, 2, 3})):  # a long anomaly on three ranks
        det.process_step(b)
    assert det.threshold() == pytest.approx(before, rel=0.3)
    history = np.fromiter(det.scores, dtype=float)
    assert (history > before).mean() < 0.01  # the broken ranks' scores were kept out


def test_a_saved_model_is_plain_arrays_and_scores_alike(tmp_path: Path) -> None:
    det = _fitted("isolation_forest")
    path = tmp_path / "model.npz"
    save_models(path, [det])
    with np.load(path, allow_pickle=False) as data:
        assert all(data[k].dtype != object for k in data.files)
    (loaded,) = load_models(path)
    assert loaded.features == det.features
    b = next(_steps(130, 131, seed=4, broken=frozenset({7})))
    det.process_step(b)
    loaded.process_step(b)
    assert loaded.threshold() == pytest.approx(det.threshold())


def test_a_bad_model_file_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a model")
    with pytest.raises(DetectorError, match="cannot read model file"):
        load_models(bad)
    np.savez(tmp_path / "empty.npz", x=np.zeros(2))
    with pytest.raises(DetectorError, match="holds no fitted scorer"):
        load_models(tmp_path / "empty.npz")
