"""`eagleeye detect` and `eagleeye eval`, run through the real console entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from detectors.eval.nab import probation_length
from detectors.eval.nab_detectors import artime_discord_extreme_flags
from detectors.univariate import RecordDetector
from eagleeye.cli import main


def _refused(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON")


def test_generate_detect_and_eval_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    assert main(["eval", "generate", str(trace), "--seed", "11"]) == 0
    labels = json.loads((tmp_path / "t.labels.json").read_text())
    assert len(labels) == 10
    out = tmp_path / "findings.jsonl"
    assert main(["detect", str(trace), "--output", str(out)]) == 0
    # strict JSON, as any other language's parser reads it: no bare NaN or Infinity
    findings = [json.loads(line, parse_constant=_refused) for line in out.read_text().splitlines()]
    assert {f["kind"] for f in findings} == {w["kind"] for w in labels}
    (nan,) = [f for f in findings if f["kind"] == "nan"]
    assert "nan" in nan["evidence"].values()  # the broken value, spelt as a string
    assert all(f["evidence"] for f in findings)
    capsys.readouterr()
    assert main(["eval", "trace", str(trace), "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text(), parse_constant=_refused)
    assert result["summary"]["min_class_f1"] == 1.0
    assert "localisation" in capsys.readouterr().out


def test_eval_trace_scores_a_healthy_trace_and_refuses_one_without_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "h.csv"
    assert main(["eval", "generate", str(trace), "--healthy", "--steps", "200"]) == 0
    assert json.loads((tmp_path / "h.labels.json").read_text()) == []
    assert main(["eval", "trace", str(trace), "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["healthy_traces"] == 1
    assert result["traces"] == 0
    assert result["summary"]["healthy_node_days"] > 0
    assert result["summary"]["false_alarms_per_node_day"] == 0.0
    (tmp_path / "h.labels.json").unlink()
    capsys.readouterr()
    assert main(["eval", "trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "h.labels.json not found" in err
    assert "eagleeye detect" in err


def test_detect_on_a_nab_style_series(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = 10 + rng.standard_normal(1000)
    values[700] = 40.0
    stamps = pd.date_range("2024-01-01", periods=1000, freq="5min").astype(str)
    src = tmp_path / "s.csv"
    pd.DataFrame({"timestamp": stamps, "value": values}).to_csv(src, index=False)
    out = tmp_path / "scored.csv"
    assert main(["detect", str(src), "-o", str(out)]) == 0
    scored = pd.read_csv(out)
    assert list(scored.columns) == ["timestamp", "value", "anomaly_score", "is_anomaly"]
    assert scored["is_anomaly"].iloc[700] == 1
    assert scored["anomaly_score"].between(0, 1).all()
    assert scored["anomaly_score"].iloc[700] == scored["anomaly_score"].max() == 1.0
    # The default is the detector `eagleeye eval nab` scores, given what NAB gives it.
    expected = artime_discord_extreme_flags(
        values, probation_length(1000), values.min(), values.max()
    )
    assert np.array_equal(scored["is_anomaly"].to_numpy(dtype=bool), expected)
    record = tmp_path / "record.csv"
    assert main(["detect", str(src), "--detector", "record", "-o", str(record)]) == 0
    by_record = pd.read_csv(record)["is_anomaly"].to_numpy(dtype=bool)
    assert np.array_equal(by_record, RecordDetector().detect(values, probation_length(1000)).flags)
    assert not np.array_equal(by_record, expected)


def test_detect_on_a_series_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    values = 10 + np.random.default_rng(1).standard_normal(3000)
    stamps = pd.date_range("2024-01-01", periods=3000, freq="5min").astype(str)
    src = tmp_path / "s.csv"
    pd.DataFrame({"timestamp": stamps, "value": values}).to_csv(src, index=False)
    eagleeye = Path(sys.executable).with_name("eagleeye")
    shell = f"'{eagleeye}' detect '{src}' | head -n 2"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[0] == "timestamp,value,anomaly_score,is_anomaly"
    assert len(done.stdout.splitlines()) == 2
    assert "Traceback" not in done.stderr, done.stderr


def test_detector_is_refused_for_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    assert main(["eval", "generate", str(trace), "--seed", "11", "--steps", "60"]) == 0
    capsys.readouterr()
    assert main(["detect", str(trace), "--detector", "record"]) == 2
    assert "--detector picks a timestamp,value series' detector" in capsys.readouterr().err


def test_bad_input_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["detect", str(tmp_path / "nope.csv")]) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["detect", str(bad)]) == 2
    assert "lacks column" in capsys.readouterr().err
    short = tmp_path / "short.csv"
    stamps = pd.date_range("2024-01-01", periods=80, freq="5min").astype(str)
    pd.DataFrame({"timestamp": stamps, "value": np.arange(80.0)}).to_csv(short, index=False)
    assert main(["detect", str(short)]) == 2
    err = capsys.readouterr().err
    assert "short.csv" in err
    assert "at least 107" in err
    assert "--detector record" in err
    assert main(["detect", str(short), "--detector", "record", "-o", str(tmp_path / "o")]) == 0


def test_eval_nab_reports_three_profiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "nab"
    (root / "data" / "g").mkdir(parents=True)
    stamps = pd.date_range("2024-01-01", periods=400, freq="5min")
    values = np.sin(np.arange(400) / 4.0)
    values[300] = 9.0
    pd.DataFrame({"timestamp": stamps.astype(str), "value": values}).to_csv(
        root / "data" / "g" / "f.csv", index=False
    )
    window = [str(stamps[290]), str(stamps[320])]
    (root / "windows.json").write_text(json.dumps({"g/f.csv": [window]}))
    assert main(["eval", "nab", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "standard" in out
    assert "reward_low_FP_rate" in out
    assert "detected 1, missed 0" in out


def test_detect_fits_on_a_healthy_run_saves_reloads_and_writes_scores(tmp_path, capsys) -> None:
    import pandas as pd

    from eagleeye.cli import main as cli

    healthy, faulty = tmp_path / "h.csv", tmp_path / "f.csv"
    assert (
        cli(["eval", "generate", str(healthy), "--healthy", "--steps", "160", "--seed", "1"]) == 0
    )
    assert cli(["eval", "generate", str(faulty), "--seed", "3000"]) == 0
    model, scores = tmp_path / "m.npz", tmp_path / "scores.csv"
    out1, out2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    argv = ["detect", str(faulty), "--fit", str(healthy), "--learned", "pca"]
    assert cli([*argv, "--save-model", str(model), "--scores", str(scores), "-o", str(out1)]) == 0
    assert cli(["detect", str(faulty), "--model", str(model), "-o", str(out2)]) == 0
    assert out1.read_text() == out2.read_text()  # the saved model scores alike
    assert '"multivariate"' in out1.read_text()
    table = pd.read_csv(scores)
    assert list(table.columns) == ["step", "time", "rank", "scorer", "score", "threshold"]
    assert set(table["scorer"]) == {"pca"}
    assert len(table) > 1000
    capsys.readouterr()
    assert cli(["detect", str(faulty), "--model", str(model), "--fit", str(healthy)]) == 2
    assert "give one" in capsys.readouterr().err
    assert cli(["detect", str(faulty), "--model", str(tmp_path / "none.npz")]) == 2
    assert "cannot read model file" in capsys.readouterr().err


def test_a_trace_named_with_dots_keeps_them_in_its_labels_name(tmp_path: Path) -> None:
    """``s1_m0.3.csv``'s labels are ``s1_m0.3.labels.json`` (the name was cut at its first
    dot, so two traces s1_m0.3 and s1_m0.5 shared one labels file); a labels file named
    the old way is still found."""
    from detectors.eval.trace import labels_path

    trace = tmp_path / "s1_m0.3.csv"
    assert main(["eval", "generate", str(trace), "--healthy", "--steps", "50"]) == 0
    assert (tmp_path / "s1_m0.3.labels.json").is_file()
    assert not (tmp_path / "s1_m0.labels.json").exists()
    assert labels_path(trace) == tmp_path / "s1_m0.3.labels.json"
    assert labels_path(tmp_path / "x.csv.gz") == tmp_path / "x.labels.json"
    (tmp_path / "s1_m0.3.labels.json").rename(tmp_path / "s1_m0.labels.json")
    assert labels_path(trace) == tmp_path / "s1_m0.labels.json"
