"""The detectors `eagleeye eval nab` scores: given the values, the probation and the file's
minimum and maximum (what NAB's harness hands every detector), never the labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from detectors.errors import DetectorError
from detectors.eval.nab import probation_length
from detectors.eval.nab_artime import artime_scores
from detectors.eval.nab_artime_extreme import ArtimeExtremeFamily
from detectors.eval.nab_corpus import NabFile
from detectors.eval.nab_detectors import (
    ARTIME_REST_BLOCKS,
    ARTIME_THRESHOLD,
    DEFAULT_DETECTOR,
    DETECTORS,
    artime_discord_extreme_flags,
    artime_discord_extreme_verdict,
    artime_flags,
    nab_detector,
    series_verdict,
)
from detectors.eval.nab_eval import evaluate_nab


def _wave(n: int, spike_at: int | None = None, seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = 10 + np.sin(np.arange(n) * 2 * np.pi / 40) + 0.05 * rng.normal(size=n)
    if spike_at is not None:
        x[spike_at] = 20.0
    return x


def _corpus(root: Path, category: str, n: int = 3000, spike_at: int = 2000) -> None:
    """A NAB-format folder with one file of ``category`` and one window around a spike."""
    (root / "data" / category).mkdir(parents=True)
    stamps = pd.date_range("2024-01-01", periods=n, freq="5min")
    pd.DataFrame({"timestamp": stamps.astype(str), "value": _wave(n, spike_at)}).to_csv(
        root / "data" / category / "machine.csv", index=False
    )
    window = [str(stamps[spike_at - 20]), str(stamps[min(spike_at + 40, n - 1)])]
    (root / "windows.json").write_text(json.dumps({f"{category}/machine.csv": [window]}))


def test_the_default_is_artime_discord_extreme_and_every_name_resolves() -> None:
    assert DEFAULT_DETECTOR == "artime_discord_extreme"
    assert set(DETECTORS) == {"artime_discord_extreme", "artime", "record"}
    for name in DETECTORS:
        assert nab_detector(name) is DETECTORS[name]


def test_an_unknown_detector_is_a_one_line_error_naming_the_choices() -> None:
    with pytest.raises(
        DetectorError, match="unknown NAB detector 'htm'.*artime, artime_discord_extreme, record"
    ):
        nab_detector("htm")


def test_artime_flags_the_spike_and_nothing_else() -> None:
    x = _wave(3000, spike_at=2000)
    flags = artime_flags(x, probation_length(len(x)), float(x.min()), float(x.max()))
    hits = np.flatnonzero(flags)
    assert len(hits) == 1
    assert 2000 <= hits[0] < 2000 + 8 * 3


def test_artime_keeps_only_detections_at_the_threshold() -> None:
    x = _wave(3000, seed=4)
    x[1500:1600] += 1.5
    scores = artime_scores(x, float(x.min()), float(x.max()))
    flags = artime_flags(x, probation_length(len(x)), float(x.min()), float(x.max()))
    above = scores >= ARTIME_THRESHOLD
    assert above.sum() >= flags.sum() > 0
    # Every flag is a detection at the threshold (the rest drops some of them).
    assert not (flags & ~above).any()


def test_artime_rests_after_a_detection_kept() -> None:
    # The series turns noisy: ARTime founds a new cluster at 1507, 1511 and 1515 (blocks
    # of 4 rows) and again at 1575; a rest of 8 blocks keeps 1507 and 1575.
    x = _wave(3000)
    x[1500:1700] += np.random.default_rng(0).normal(size=200)
    low, high, probation = float(x.min()), float(x.max()), probation_length(len(x))
    scores = artime_scores(x, low, high)
    assert np.flatnonzero(scores >= ARTIME_THRESHOLD).tolist() == [1507, 1511, 1515, 1575]
    assert ARTIME_REST_BLOCKS == 8
    assert np.flatnonzero(artime_flags(x, probation, low, high)).tolist() == [1507, 1575]


def test_artime_is_online_given_the_range() -> None:
    # With the range and the probation fixed, the verdicts on a prefix are those on the
    # whole series cut there (up to the last whole block of the prefix).
    x = _wave(3000, spike_at=2500)
    x[1400:1500] += 2.0
    low, high, probation = float(x.min()), float(x.max()), probation_length(len(x))
    whole = artime_flags(x, probation, low, high)
    cut = 2000
    prefix = artime_flags(x[:cut], probation, low, high)
    assert whole[:cut].any()
    assert np.array_equal(prefix, whole[:cut])


def _burst(seed: int = 2) -> np.ndarray:
    """The wave turning noisy at 1500 for 200 rows, with one spike above every earlier
    value at 2500."""
    x = _wave(3000, spike_at=2500, seed=seed)
    x[1500:1700] += np.random.default_rng(0).normal(size=200)
    return x


def test_the_default_is_the_setting_the_protocol_chose() -> None:
    # ARTime (published constants, threshold 0.3, rest 8 blocks), discord rank 0.9 over
    # stretches of 16 values, new-extreme margin 0.05: the choice of four of the six
    # standard folds (docs/benchmarks.md).
    x = _burst()
    f = NabFile("realTest/a.csv", np.arange(len(x)).astype(str), x, ((1490, 1620),))
    chosen = (0.8, 0.075, 0.19, 0.3, 8.0, 4.0, 0.9, 16.0, 0.05)
    expected = ArtimeExtremeFamily().flags([f], chosen)[0]
    low, high, probation = float(x.min()), float(x.max()), probation_length(len(x))
    flags = artime_discord_extreme_flags(x, probation, low, high)
    assert np.array_equal(flags, expected)
    # ARTime alone: the burst at 1507, a new cluster at 1815 on the wave after it, and the
    # spike three rows late (at the end of its 4-row block).
    assert np.flatnonzero(artime_flags(x, probation, low, high)).tolist() == [1507, 1815, 2503]
    # The burst (a shape the file never had) is confirmed; 1815, a shape the file has had
    # often, is not; the spike is a new extreme at its own row (its ARTime detection and
    # the burst's own new extreme at 1508 fall in the rest after them).
    assert np.flatnonzero(flags).tolist() == [1507, 2500]


def test_a_new_extreme_scores_one_and_a_confirmed_detection_keeps_artimes_score() -> None:
    x = _burst()
    verdict = series_verdict("artime_discord_extreme", x, probation_length(len(x)))
    scores = artime_scores(x, float(x.min()), float(x.max()))
    assert verdict.scores[2500] == 1.0
    assert verdict.scores[1507] == scores[1507] > 0
    assert verdict.scores.min() >= 0.0
    assert verdict.scores.max() <= 1.0


def test_the_default_is_online_given_the_range() -> None:
    x = _burst()
    low, high, probation = float(x.min()), float(x.max()), probation_length(len(x))
    whole = artime_discord_extreme_verdict(x, probation, low, high).flags
    cut = 2000
    prefix = artime_discord_extreme_verdict(x[:cut], probation, low, high).flags
    assert whole[:cut].any()
    assert np.array_equal(prefix, whole[:cut])


def test_a_category_the_corpus_lacks_gets_scored(tmp_path: Path) -> None:
    _corpus(tmp_path, "realKnownCause")
    result = evaluate_nab(tmp_path)
    assert result.detector == "artime_discord_extreme"
    assert (result.files, result.windows, result.tp, result.fn, result.fp) == (1, 1, 1, 0, 0)
    assert result.scores["standard"] > 90.0


def test_a_file_too_short_for_artime_is_named_in_the_error(tmp_path: Path) -> None:
    _corpus(tmp_path, "realKnownCause", n=100, spike_at=60)
    with pytest.raises(DetectorError, match="realKnownCause/machine.csv: ARTime needs"):
        evaluate_nab(tmp_path)
    assert evaluate_nab(tmp_path, name="record").files == 1
