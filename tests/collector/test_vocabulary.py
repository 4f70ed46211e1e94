from __future__ import annotations

from pathlib import Path

import pytest

from collector.host import HostSource
from collector.nvml import NvmlPoller
from collector.promtext import parse_exposition
from collector.testing import FakeNVML
from collector.vocabulary import (
    ALIASES,
    METRICS,
    canonical,
    canonical_name,
    canonical_values,
    is_canonical,
    lookup,
    scale_of,
)

#: dcgm-exporter fields that are static labels or per-lane detail, not metrics of ours.
NOT_METRICS = {"DCGM_FI_DRIVER_VERSION", "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0"}
#: The metric fields of dcgm-exporter's shipped counter lists (default and profiling).
DCGM_FIELDS = [
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_EXP_GPU_HEALTH_STATUS",
    "DCGM_EXP_P2P_STATUS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
]


def test_every_dcgm_exporter_field_has_one_canonical_name() -> None:
    unknown = [f for f in DCGM_FIELDS if f not in ALIASES]
    assert unknown == []


def test_every_series_of_real_dcgm_exporter_dumps_is_known(fixtures: Path) -> None:
    for dump in ("dcgm-exporter-3.3-h100.prom", "dcgm-exporter-4.1-h100-xid79.prom"):
        text = (fixtures / "telemetry" / dump).read_text()
        names = {s.name for s in parse_exposition(text, time=0.0).samples} - NOT_METRICS
        assert names, dump
        assert [n for n in names if lookup(n) is None] == [], dump


def test_the_nvml_poller_and_the_host_poller_speak_the_vocabulary() -> None:
    gpu = NvmlPoller(node="n", nvml=FakeNVML(gpus=1), clock=lambda: 0.0).collect()
    assert {s.name for s in gpu}
    assert all(is_canonical(s.name) for s in gpu)
    host = HostSource(node="n").collect()
    assert {s.name for s in host}
    assert all(lookup(s.name) is not None for s in host)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("DCGM_FI_DEV_FB_USED", 81559.0, ("mem_used", 81559 * 2**20 / 1e9)),  # MiB -> GB
        ("gpu_mem_used_bytes", 3e9, ("mem_used", 3.0)),
        ("DCGM_FI_DEV_GPU_TEMP", 70.0, ("gpu_temp", 70.0)),
        ("DCGM_FI_DEV_SM_CLOCK", 1410.0, ("sm_clock", 1410.0)),
        ("DCGM_FI_DEV_XID_ERRORS", 79.0, ("xid", 79.0)),
        ("DCGM_FI_DEV_POWER_USAGE", 612.5, ("power", 612.5)),
        ("DCGM_FI_PROF_SM_ACTIVE", 0.25, ("sm_active", 25.0)),  # ratio -> %
        ("DCGM_FI_DEV_THERMAL_VIOLATION", 2e9, ("thermal_violation", 2.0)),  # ns -> s
        ("step_time_ms", 250.0, ("step_time", 0.25)),
        ("section.data", 0.004, ("data_wait_ms", 4.0)),
        ("collective_time", 0.1, ("comm_ms", 100.0)),
        ("compute_s", 0.5, ("compute_ms", 500.0)),
        ("gpu_temp", 70.0, ("gpu_temp", 70.0)),
        ("section.forward", 0.2, ("section.forward", 0.2)),
        ("user_metric", 1.5, ("user_metric", 1.5)),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total", 3.0, ("pcie_replays", 3.0)),  # a counter
    ],
)
def test_an_alias_becomes_its_canonical_name_and_unit(
    name: str, value: float, expected: tuple[str, float]
) -> None:
    got = canonical(name, value)
    assert got[0] == expected[0] == canonical_name(name)
    assert got[1] == pytest.approx(expected[1])
    assert value * scale_of(name) == pytest.approx(expected[1])


def test_a_canonical_value_wins_over_its_alias_beside_it() -> None:
    values = {"gpu_temp_c": 90.0, "gpu_temp": 70.0, "DCGM_FI_DEV_SM_CLOCK": 1400.0}
    assert canonical_values(values) == {"gpu_temp": 70.0, "sm_clock": 1400.0}


def test_names_are_unique_and_aliases_never_shadow_a_canonical_name() -> None:
    assert not set(ALIASES) & set(METRICS)
    for metric in METRICS.values():
        assert metric.unit is not None
        assert metric.help
        assert metric.scope in {"rank", "gpu", "node", "job"}
        assert metric.kind in {"gauge", "counter", "event"}
        for alias in metric.aliases:
            assert ALIASES[alias.name] == (metric.name, alias.scale)
            assert alias.source in {"hook", "nvml", "dcgm", "host", "unit", "export"}


def test_today_s_trace_format_names_are_canonical() -> None:
    trace_format = [
        "step_time",
        "compute_ms",
        "data_wait_ms",
        "comm_ms",
        "nic_gbps",
        "gpu_temp",
        "sm_clock",
        "mem_used",
        "loss",
        "grad_norm",
        "xid",
        "ecc_dbe",
        "row_remap_failure",
        "collective_timeout",
        "in_collective",
        "exit_code",
        "tokens_per_s",
        "gpu_util",
        "power",
        "host_cpu",
    ]
    assert [n for n in trace_format if n not in METRICS] == []


def test_base_units_are_what_prometheus_expects() -> None:
    assert (METRICS["comm_ms"].base_unit, METRICS["comm_ms"].to_base(250.0)) == ("seconds", 0.25)
    assert (METRICS["mem_used"].base_unit, METRICS["mem_used"].to_base(2.0)) == ("bytes", 2e9)
    assert METRICS["gpu_util"].to_base(50.0) == 0.5
    assert lookup("section.backward") is not None
    assert lookup("section.backward").unit == "s"  # type: ignore[union-attr]


def test_the_metrics_page_lists_every_metric_and_alias() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    missing = [n for n in [*METRICS, *ALIASES] if f"`{n}`" not in page]
    assert missing == []
