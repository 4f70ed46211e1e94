"""A trace in DCGM, NVML or other units' names gives the same findings as in canonical ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collector.types import Frame
from detectors.config import DetectorsConfig
from detectors.eval.generate import TraceSpec, generate
from detectors.eval.runner import run_trace
from detectors.eval.trace import Trace, read_trace, write_trace

#: canonical name -> (alias, factor from the canonical unit to the alias's).
AS_SOURCES_NAME_THEM = {
    "gpu_temp": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK", 1.0),
    "mem_used": ("DCGM_FI_DEV_FB_USED", 1e9 / 2**20),  # GB -> MiB
    "xid": ("DCGM_FI_DEV_XID_ERRORS", 1.0),
    "gpu_util": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "power": ("gpu_power_w", 1.0),  # NVML's name
    "step_time": ("step_time_ms", 1e3),
    "compute_ms": ("compute_s", 1e-3),
    "data_wait_ms": ("section.data", 1e-3),  # the hook's name, in seconds
    "comm_ms": ("collective_time", 1e-3),
}


def _renamed(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.copy()
    for canonical, (alias, factor) in AS_SOURCES_NAME_THEM.items():
        hit = rows["metric"] == canonical
        rows.loc[hit, "value"] = rows.loc[hit, "value"] * factor
        rows.loc[hit, "metric"] = alias
    return rows


def _summary(trace: Trace) -> list[tuple[str, str, int | None, int]]:
    return [
        (e.finding.kind, str(e.finding.subject), e.finding.step, e.step)
        for e in run_trace(trace, DetectorsConfig())
    ]


@pytest.fixture(scope="module")
def trace() -> Trace:
    return generate(TraceSpec(nodes=4, ranks_per_node=4, seed=3000))


def test_a_trace_in_dcgm_names_gives_the_same_findings(trace: Trace, tmp_path: Path) -> None:
    canonical_file, dcgm_file = tmp_path / "canonical.csv", tmp_path / "dcgm.csv"
    write_trace(trace, canonical_file)
    rows = pd.read_csv(canonical_file)
    _renamed(rows).to_csv(dcgm_file, index=False)
    (tmp_path / "dcgm.labels.json").write_text((tmp_path / "canonical.labels.json").read_text())
    assert "DCGM_FI_DEV_FB_USED" in set(pd.read_csv(dcgm_file)["metric"])

    from_canonical, from_dcgm = read_trace(canonical_file), read_trace(dcgm_file)
    assert from_dcgm.metrics == from_canonical.metrics
    np.testing.assert_allclose(from_dcgm.values, from_canonical.values, rtol=1e-12)
    found = _summary(from_canonical)
    assert len(found) >= 8  # the trace's faults are found at all
    assert _summary(from_dcgm) == found


def test_frames_in_aliases_reach_the_detectors_in_canonical_names(trace: Trace) -> None:
    canonical_pipe, alias_pipe = DetectorsConfig().build(), DetectorsConfig().build()
    renames = {c: a for c, a in AS_SOURCES_NAME_THEM.items()}
    got: dict[str, list[tuple[str, str, int | None]]] = {"canonical": [], "alias": []}
    for batch in list(trace.batches())[:260]:
        for frame in batch.frames():
            aliased = Frame(
                frame.subject,
                frame.step,
                frame.time,
                {
                    renames[k][0] if k in renames else k: v * renames[k][1] if k in renames else v
                    for k, v in frame.values.items()
                },
            )
            got["canonical"] += [
                (f.kind, str(f.subject), f.step) for f in canonical_pipe.process(frame)
            ]
            got["alias"] += [(f.kind, str(f.subject), f.step) for f in alias_pipe.process(aliased)]
    assert got["canonical"], "the first faults of the trace give findings"
    assert got["alias"] == got["canonical"]


def test_a_canonical_row_wins_over_its_alias_in_the_same_observation() -> None:
    rows = pd.DataFrame(
        {
            "time": [1.0, 1.0, 1.0],
            "step": [0, 0, 0],
            "job": "j",
            "replica": 0,
            "node": "n0",
            "rank": [0, 0, 1],
            "metric": ["gpu_temp", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP"],
            "value": [70.0, 99.0, 65.0],
        }
    )
    trace = Trace.from_long(rows)
    assert trace.metrics == ("gpu_temp",)
    assert trace.values[0, :, 0].tolist() == [70.0, 65.0]
