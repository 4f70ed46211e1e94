from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collector.types import Frame, Subject
from detectors.config import DetectorsConfig, from_mapping, load_config
from detectors.errors import DetectorError, UnknownDetectorError
from detectors.learned import AutoencoderModel, IsolationForestModel, PCAModel, WindowedBatch
from detectors.registry import create

FEATURES = ("a", "b", "c")


def _frame(rng: np.random.Generator, broken: bool = False, extreme: bool = False) -> Frame:
    a = rng.standard_normal() + (5.0 if extreme else 0.0)
    b = 2 * a + 0.05 * rng.standard_normal()
    if broken:
        b = -2 * a  # each value is ordinary; the relation between them is not
    return Frame(Subject(0, 0, "n0"), 0, 0.0, {"a": a, "b": b, "c": rng.standard_normal()})


@pytest.mark.parametrize(
    ("model", "anomaly"),
    [
        (IsolationForestModel, {"extreme": True}),
        (PCAModel, {"broken": True}),
        (AutoencoderModel, {"broken": True}),
    ],
)
def test_windowed_batch_scores_anomalies_higher(model: type, anomaly: dict[str, bool]) -> None:
    rng = np.random.default_rng(0)
    scorer = WindowedBatch(model, FEATURES, window=256, refit_every=256, min_fit=128)
    assert scorer.score_one(_frame(rng)) == 0.0  # nothing fitted yet
    for _ in range(256):
        scorer.learn_one(_frame(rng))
    normal = [scorer.score_one(_frame(rng)) for _ in range(50)]
    broken = [scorer.score_one(_frame(rng, **anomaly)) for _ in range(50)]
    assert np.median(broken) > np.quantile(normal, 0.9)


def test_gated_learned_detector_fires_on_the_anomaly() -> None:
    rng = np.random.default_rng(1)
    det = create("pca_reconstruction", {"features": FEATURES, "min_fit": 64, "margin": 1.0})
    for _ in range(300):
        det.process(_frame(rng))
    found = det.process(_frame(rng, broken=True))
    assert [f.kind for f in found] == ["multivariate"]
    assert found[0].evidence["score"] >= found[0].evidence["threshold"]


def test_windowed_batch_validates_its_parameters() -> None:
    with pytest.raises(DetectorError, match="min_fit"):
        WindowedBatch(PCAModel, FEATURES, window=10, min_fit=20)


def test_config_file_builds_the_named_detectors(tmp_path: Path) -> None:
    path = tmp_path / "det.toml"
    path.write_text(
        '[[detectors]]\nname = "peer_outlier"\nparams = { z = 4.0 }\n[fusion]\nhold_steps = 0\n'
    )
    config = load_config(path)
    pipeline = config.build()
    assert [d.name for d in pipeline.detectors] == ["peer_outlier"]
    assert pipeline.fuser.policy.hold_steps == 0


def test_unknown_detector_lists_known_names() -> None:
    with pytest.raises(UnknownDetectorError, match="peer_outlier"):
        from_mapping({"detectors": [{"name": "nope"}]}).build()


def test_bad_config_entries_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DetectorError, match="needs a name"):
        from_mapping({"detectors": [{"params": {}}]})
    with pytest.raises(DetectorError, match="fusion"):
        from_mapping({"fusion": {"hold_steps": -1}})
    with pytest.raises(DetectorError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(DetectorError, match="bad parameters"):
        create("peer_outlier", {"nonsense": 1})


def test_default_config_covers_every_fault_class_detector() -> None:
    names = {d.name for d in DetectorsConfig().build().detectors}
    assert {"peer_outlier", "collective_hang", "xid", "non_finite_loss", "loss_spike"} <= names
