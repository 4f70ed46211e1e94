from __future__ import annotations

from pathlib import Path

import pytest

from detectors.config import DetectorsConfig, from_mapping, load_config
from detectors.errors import DetectorError, UnknownDetectorError
from detectors.registry import create


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
