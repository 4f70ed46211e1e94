from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from detectors.errors import DetectorError
from detectors.eval.generate import FAULT_KINDS, METRICS, TraceSpec, generate
from detectors.eval.trace import COLUMNS, Trace, read_labels, read_trace, write_trace


def test_generated_trace_has_one_window_per_class_and_is_reproducible() -> None:
    trace = generate(TraceSpec(nodes=4, ranks_per_node=4, seed=3))
    assert sorted(w.kind for w in trace.labels) == sorted(FAULT_KINDS)
    again = generate(TraceSpec(nodes=4, ranks_per_node=4, seed=3))
    assert np.array_equal(trace.values, again.values, equal_nan=True)
    windows = sorted((w.start_step, w.end_step) for w in trace.labels)
    assert all(a[1] < b[0] for a, b in zip(windows, windows[1:], strict=False))


def test_faults_show_in_the_metrics_they_should() -> None:
    trace = generate(TraceSpec(nodes=4, ranks_per_node=4, seed=7))
    m = {name: i for i, name in enumerate(METRICS)}
    for w in trace.labels:
        ticks = np.flatnonzero(trace.steps == w.start_step)
        row = trace.values[ticks[-1]]
        if w.kind == "nan":
            rank = int(w.subject.split(":")[1])
            assert np.isnan(row[rank, m["loss"]])
            assert trace.present[ticks[-1], rank, m["loss"]]
        if w.kind == "xid":
            rank = int(w.subject.split(":")[1])
            assert row[rank, m["xid"]] in (48, 79, 94, 95, 119, 120, 154)
        if w.kind == "hang":
            stuck = trace.values[ticks[0]]
            assert np.isnan(stuck[:, m["step_time"]]).all()
            assert (stuck[:, m["in_collective"]] == 0).sum() == 1


def test_healthy_trace_has_no_labels_and_reports_node_days() -> None:
    trace = generate(TraceSpec(nodes=4, faults=(), steps=500, seed=1))
    assert trace.labels == ()
    assert len(trace.steps) == 500
    assert trace.node_days == pytest.approx(4 * (trace.times[-1] - trace.times[0]) / 86400)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_round_trip_through_the_long_format(tmp_path: Path, suffix: str) -> None:
    if suffix == ".parquet":
        pytest.importorskip("pyarrow", reason="Parquet needs the eval extra (pyarrow)")
    trace = generate(TraceSpec(nodes=2, ranks_per_node=2, seed=2))
    path = tmp_path / f"t{suffix}"
    write_trace(trace, path)
    back = read_trace(path)
    assert back.labels == trace.labels
    assert back.metrics == tuple(sorted(METRICS))
    order = [METRICS.index(name) for name in back.metrics]
    assert np.allclose(back.values, trace.values[:, :, order], equal_nan=True)
    assert np.array_equal(back.present, trace.present[:, :, order])
    assert list(pd.read_csv(path).columns) == list(COLUMNS) if suffix == ".csv" else True


def test_scale_generation_to_a_hundred_thousand_ranks() -> None:
    trace = generate(TraceSpec(nodes=12500, ranks_per_node=8, faults=(), steps=2, seed=0))
    assert trace.values.shape == (2, 100_000, len(METRICS))


def test_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        TraceSpec(faults=("gremlins",))
    with pytest.raises(DetectorError, match="lacks column"):
        Trace.from_long(pd.DataFrame({"time": [1.0]}))
    bad = tmp_path / "l.json"
    bad.write_text('[{"kind": "hang"}]')
    with pytest.raises(DetectorError, match="start_step"):
        read_labels(bad)
    with pytest.raises(DetectorError, match="not found"):
        read_trace(tmp_path / "missing.csv")
