from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.errors import CollectorError
from collector.kmsg import parse_kmsg
from collector.nvml import NvmlPoller, is_available, pci_short
from collector.testing import FakeNVML
from collector.vocabulary import is_canonical


def _values(samples: list, name: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in samples if s.name == name}


@pytest.fixture
def nvml() -> FakeNVML:
    return FakeNVML(gpus=2)


def test_every_signal_is_read_per_gpu_with_node_and_identity(nvml: FakeNVML) -> None:
    samples = NvmlPoller(node="n1", nvml=nvml, clock=lambda: 3.0).collect()
    names = {s.name for s in samples}
    # Canonical names (collector.vocabulary), whatever NVML calls them.
    assert names >= {
        "gpu_util",
        "mem_used",
        "gpu_temp",
        "power",
        "sm_clock",
        "mem_clock",
        "throttle_reasons",
        "ecc_dbe",
        "remapped_rows_uncorrectable",
        "pcie_replays",
        "nvlink_crc_flit_errors",
    }
    assert all(is_canonical(name) for name in names - {"gpu_xid"})
    assert _values(samples, "power") == {"0": 412.0, "1": 412.0}  # mW -> W
    assert _values(samples, "mem_used")["0"] == pytest.approx(nvml.devices[0].mem_used / 1e9)
    first = samples[0]
    assert dict(first.labels) == {
        "node": "n1",
        "gpu": "0",
        "uuid": "GPU-fake-0000",
        "pci": "0000:18:00",
    }
    assert first.time == 3.0


def test_changes_between_polls_show_in_the_next_poll(nvml: FakeNVML) -> None:
    poller = NvmlPoller(node="n1", nvml=nvml)
    poller.collect()
    gpu = nvml.devices[1]
    gpu.temp, gpu.throttle, gpu.pcie_replays = 91, 0x40, 12
    gpu.ecc[1] = 2
    gpu.remapped = (0, 1, True, False)
    gpu.nvlink_errors[2] = 7
    samples = poller.collect()
    assert _values(samples, "gpu_temp") == {"0": 45.0, "1": 91.0}
    assert _values(samples, "throttle_thermal") == {"0": 0.0, "1": 1.0}
    assert _values(samples, "throttle_power") == {"0": 0.0, "1": 0.0}
    assert _values(samples, "pcie_replays")["1"] == 12.0
    assert _values(samples, "ecc_dbe")["1"] == 2.0
    assert _values(samples, "row_remap_pending")["1"] == 1.0
    assert _values(samples, "nvlink_crc_flit_errors")["1"] == 7.0


def test_xid_events_come_once_with_the_gpu_that_sent_them(nvml: FakeNVML) -> None:
    poller = NvmlPoller(node="n1", nvml=nvml)
    poller.collect()
    nvml.inject_xid(1, 79)
    nvml.inject_xid(0, 13)
    xids = [
        (s.labels["gpu"], s.value, s.labels["severity"])
        for s in poller.collect()
        if s.name == "gpu_xid"
    ]
    assert xids == [("1", 79.0, "fatal"), ("0", 13.0, "warn")]
    assert not [s for s in poller.collect() if s.name == "gpu_xid"]
    assert [e.value for e in poller.events] == [79.0, 13.0]


def test_unsupported_metric_is_asked_once_then_skipped(nvml: FakeNVML) -> None:
    nvml.devices[0].unsupported.add("remapped_rows")  # e.g. a pre-Ampere GPU
    poller = NvmlPoller(node="n1", nvml=nvml)
    for _ in range(3):
        samples = poller.collect()
    assert _values(samples, "row_remap_pending") == {"1": 0.0}
    assert nvml.calls["remapped_rows"] == 1 + 3
    assert poller.dropped["not_supported:remapped_rows"] == 1


def test_a_lost_gpu_is_counted_and_the_others_still_read(nvml: FakeNVML) -> None:
    poller = NvmlPoller(node="n1", nvml=nvml)
    poller.collect()
    nvml.devices[0].lost = True
    samples = poller.collect()
    assert set(_values(samples, "gpu_temp")) == {"1"}
    assert poller.dropped["nvml_error:gpu_temp_c:NVMLError_GpuIsLost"] == 1


def test_pci_ids_map_kernel_log_xids_to_gpus(nvml: FakeNVML) -> None:
    poller = NvmlPoller(node="n1", nvml=nvml)
    line = "[ 1.0] NVRM: Xid (PCI:0000:28:00): 48, pid=1, DBE"
    event = parse_kmsg(line, time=0.0, pci_to_gpu=poller.pci_to_gpu()).events[0]
    assert event.labels["gpu"] == "1"
    assert pci_short("00000000:3B:00.0") == "0000:3b:00"
    assert pci_short(b"0000:3b:00.0") == "0000:3b:00"


def test_close_shuts_nvml_down_and_a_new_poll_starts_again(nvml: FakeNVML) -> None:
    poller = NvmlPoller(node="n1", nvml=nvml)
    poller.collect()
    poller.close()
    assert not nvml.initialised
    assert poller.collect()
    assert nvml.initialised


def test_is_available_is_false_without_a_gpu() -> None:
    # this suite runs on machines without a GPU; on a GPU machine it must be True
    import shutil

    assert is_available() == (shutil.which("nvidia-smi") is not None)


def test_no_pynvml_and_no_fake_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import collector.nvml as nvml_module

    monkeypatch.setattr(nvml_module, "_pynvml", None)
    with pytest.raises(CollectorError, match="gpu extra"):
        NvmlPoller(node="n1")
    assert not nvml_module.is_available()


_metrics = [
    "uuid",
    "pci",
    "utilization",
    "memory",
    "gpu_temp_c",
    "power",
    "gpu_sm_clock_mhz",
    "throttle",
    "gpu_ecc_corrected_total",
    "remapped_rows",
    "gpu_pcie_replays_total",
    "nvlink",
    "register_events",
]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sets(st.sampled_from(_metrics)),
            st.booleans(),
            st.integers(min_value=0, max_value=2**64),
        ),
        min_size=1,
        max_size=4,
    ),
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=2**31)),
        max_size=5,
    ),
)
def test_any_mix_of_unsupported_lost_and_odd_values_never_raises(
    gpus: list[tuple[set[str], bool, int]], xids: list[tuple[int, int]]
) -> None:
    nvml = FakeNVML(gpus=len(gpus))
    poller = NvmlPoller(node="n", nvml=nvml, clock=lambda: 0.0)
    for device, (unsupported, lost, value) in zip(nvml.devices, gpus, strict=True):
        device.unsupported, device.lost = unsupported, lost
        device.throttle = device.pcie_replays = value
    poller.collect()
    for index, code in xids:
        nvml.inject_xid(index % len(gpus), code)
    samples = poller.collect()
    assert all(s.labels["node"] == "n" for s in samples)
    registered = [
        i for i, (u, lost, _) in enumerate(gpus) if "register_events" not in u and not lost
    ]
    expected = [code for index, code in xids if index % len(gpus) in registered]
    assert [s.value for s in samples if s.name == "gpu_xid"] == [float(c) for c in expected]


@pytest.mark.gpu
@pytest.mark.skipif(not is_available(), reason="needs an NVIDIA GPU and the gpu extra")
def test_real_nvml_reads_every_gpu_of_this_machine() -> None:
    poller = NvmlPoller(node="gpu-test")
    samples = poller.collect()
    poller.close()
    gpus = {s.labels["gpu"] for s in samples}
    assert gpus
    for gpu in gpus:
        values = {s.name: s.value for s in samples if s.labels["gpu"] == gpu}
        assert 0 <= values["gpu_util"] <= 100
        assert values["mem_total"] > 0
        assert 0 < values["gpu_temp"] < 120
    print({s.name: s.value for s in samples if s.labels["gpu"] == "0"}, dict(poller.dropped))
