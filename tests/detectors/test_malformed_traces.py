"""`eagleeye detect` and `eagleeye eval trace` refuse malformed files with one line that
names the file, the line and the column: never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagleeye.cli import main

HEADER = "time,step,job,replica,node,rank,metric,value\n"
GOOD = "1.0,1,j,0,node0,0,step_time,0.1\n"

TRACES = {
    "header only": (HEADER, "no rows"),
    "nan time": (HEADER + GOOD + "nan,2,j,0,node0,0,step_time,0.1\n", "line 3, column 'time'"),
    "inf time": (HEADER + GOOD + "inf,2,j,0,node0,0,step_time,0.1\n", "line 3, column 'time'"),
    "empty time": (HEADER + ",2,j,0,node0,0,step_time,0.1\n", "line 2, column 'time'"),
    "huge step": (HEADER + "1.0," + "9" * 30 + ",j,0,node0,0,step_time,0.1\n", "'step'"),
    "fraction step": (HEADER + "1.0,1.5,j,0,node0,0,step_time,0.1\n", "line 2, column 'step'"),
    "negative step": (HEADER + "1.0,-3,j,0,node0,0,step_time,0.1\n", "column 'step'"),
    "text rank": (HEADER + "1.0,1,j,0,node0,x,step_time,0.1\n", "line 2, column 'rank'"),
    "text replica": (HEADER + "1.0,1,j,r,node0,0,step_time,0.1\n", "column 'replica'"),
    "text value": (HEADER + GOOD + "2.0,2,j,0,node0,0,loss,abc\n", "line 3, column 'value'"),
    "huge value": (HEADER + "1.0,1,j,0,node0,0,loss," + "9" * 400 + "\n", "column 'value'"),
    "empty metric": (HEADER + "1.0,1,j,0,node0,0,,0.1\n", "column 'metric'"),
    "ragged": (HEADER + "1.0,1,j,0,node0,0,loss,0.1,extra,more\n", "cannot read"),
    "wide": (",".join(f"c{i}" for i in range(1000)) + "\n", "columns, over"),
    "very wide": (",".join(f"c{i}" for i in range(1_000_000)) + "\n", "line 1: the header is"),
    "no columns": ("a,b\n1,2\n", "lacks column"),
    "empty": ("", "cannot read"),
}


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def one_line_error(capsys: pytest.CaptureFixture[str], expected: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert expected in err, err


@pytest.mark.parametrize("name", sorted(TRACES))
def test_malformed_traces_are_one_line_errors(tmp_path, capsys, name: str) -> None:
    content, expected = TRACES[name]
    path = write(tmp_path / "trace.csv", content)
    assert main(["detect", str(path)]) == 2
    one_line_error(capsys, expected)
    assert main(["eval", "trace", str(path)]) == 2
    one_line_error(capsys, expected)


def test_latin1_and_binary_traces_are_one_line_errors(tmp_path, capsys) -> None:
    latin = (HEADER + "1.0,1,j,0,nœud,0,step_time,0.1\n").encode("cp1252")
    for content in (latin, HEADER.encode() + bytes(range(256))):
        path = write(tmp_path / "trace.csv", content)
        assert main(["detect", str(path)]) == 2
        one_line_error(capsys, "not UTF-8")


SERIES = {
    "header only": ("timestamp,value\n", "no rows"),
    "huge value": ("timestamp,value\n2024-01-01," + "9" * 400 + "\n", "line 2, column 'value'"),
    "text value": ("timestamp,value\n2024-01-01,1\n2024-01-02,x\n", "line 3, column 'value'"),
    "nan value": ("timestamp,value\n2024-01-01,nan\n", "line 2, column 'value'"),
}


@pytest.mark.parametrize("name", sorted(SERIES))
def test_malformed_series_are_one_line_errors(tmp_path, capsys, name: str) -> None:
    content, expected = SERIES[name]
    path = write(tmp_path / "series.csv", content)
    assert main(["detect", str(path)]) == 2
    one_line_error(capsys, expected)


def test_a_latin1_series_is_a_one_line_error(tmp_path, capsys) -> None:
    path = write(tmp_path / "s.csv", "timestamp,value\n2024-01-01 é,1\n".encode("latin-1"))
    assert main(["detect", str(path)]) == 2
    one_line_error(capsys, "not UTF-8")
