"""`eagleeye eval nab`: the detector it scores, chosen by --detector (default: ARTime with a
discord confirmation and a new-extreme trigger)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eagleeye.cli import main


def _corpus(root: Path, category: str = "realKnownCause") -> None:
    """A NAB-format folder (windows.json + data/) with one file of a category the shipped
    corpus lacks: a noisy wave with one spike, its window around it."""
    n, spike = 3000, 2000
    rng = np.random.default_rng(2)
    x = 10 + np.sin(np.arange(n) * 2 * np.pi / 40) + 0.05 * rng.normal(size=n)
    x[spike] = 20.0
    (root / "data" / category).mkdir(parents=True)
    stamps = pd.date_range("2024-01-01", periods=n, freq="5min")
    pd.DataFrame({"timestamp": stamps.astype(str), "value": x}).to_csv(
        root / "data" / category / "machine_temperature.csv", index=False
    )
    window = [str(stamps[spike - 20]), str(stamps[spike + 40])]
    (root / "windows.json").write_text(
        json.dumps({f"{category}/machine_temperature.csv": [window]})
    )


def test_the_default_detector_scores_a_category_the_corpus_lacks(tmp_path: Path, capsys) -> None:
    _corpus(tmp_path / "nab")
    out_json = tmp_path / "r.json"
    assert main(["eval", "nab", "--root", str(tmp_path / "nab"), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "detector artime_discord_extreme" in out
    assert "files 1, windows 1: detected 1, missed 0, false positives 0" in out
    result = json.loads(out_json.read_text())
    assert result["detector"] == "artime_discord_extreme"
    assert result["scores"]["standard"] > 90.0


@pytest.mark.parametrize("name", ["artime", "record"])
def test_detector_flag_picks_the_detector(tmp_path: Path, capsys, name: str) -> None:
    _corpus(tmp_path / "nab")
    out_json = tmp_path / "r.json"
    argv = ["eval", "nab", "--root", str(tmp_path / "nab"), "--detector", name]
    assert main([*argv, "--json", str(out_json)]) == 0
    assert f"detector {name}\n" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["detector"] == name


def test_a_bad_detector_is_a_one_line_error_naming_the_choices(tmp_path: Path) -> None:
    _corpus(tmp_path / "nab")
    done = subprocess.run(
        [sys.executable, "-m", "eagleeye", "eval", "nab", "--root", str(tmp_path / "nab")]
        + ["--detector", "htm"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    choices = "artime_discord_extreme, artime, record"
    assert f"--detector 'htm' is not a NAB detector: choose one of {choices}" in line


def test_detector_with_loco_is_refused(tmp_path: Path, capsys) -> None:
    _corpus(tmp_path / "nab")
    argv = ["eval", "nab", "--root", str(tmp_path / "nab"), "--loco", "--detector", "record"]
    assert main(argv) == 2
    assert "with --loco give --family instead" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["artime", "artime_rest", "artime_discord_extreme"])
def test_loco_runs_the_artime_families(tmp_path: Path, capsys, family: str) -> None:
    root = tmp_path / "nab"
    _corpus(root, "catA")
    _corpus(root / "b", "catB")
    labels = json.loads((root / "windows.json").read_text())
    labels.update(json.loads((root / "b" / "windows.json").read_text()))
    (root / "data" / "catB").mkdir()
    (root / "b" / "data" / "catB" / "machine_temperature.csv").rename(
        root / "data" / "catB" / "machine_temperature.csv"
    )
    (root / "windows.json").write_text(json.dumps(labels))
    out_json = tmp_path / "r.json"
    argv = ["eval", "nab", "--root", str(root), "--loco", "--family", family]
    assert main([*argv, "--json", str(out_json)]) == 0
    result = json.loads(out_json.read_text())
    assert result["family"] == family
    assert {h["category"] for h in result["held"]} == {"catA", "catB"}
    assert result["mean"]["standard"] > 90.0
