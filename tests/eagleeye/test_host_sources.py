"""The host's sources: each GPU's samples name the rank using it and the real hostname, and
the host rules turn a thermal throttle, a fatal XID, an ECC error and an NCCL dump into
findings on that rank. Real files, a real HTTP server, the shipped fake NVML."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from collector.testing import FakeNVML
from detectors.types import Finding, Severity
from eagleeye.detection import host_detectors
from eagleeye.hostsources import GpuRanks, HostSources, HostSourcesConfig, host_frames
from ft_runtime.layout import JobLayout
from tests.eagleeye.dcgm_server import FakeDcgmExporter, counter_list, serving

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOST = socket.gethostname()


def findings_of(samples: list, detectors: list | None = None) -> list[Finding]:
    detectors = host_detectors() if detectors is None else detectors
    return [f for frame in host_frames(samples) for d in detectors for f in d.process(frame)]


def by_kind(found: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for finding in found:
        out.setdefault(finding.kind, []).append(finding)
    return out


def test_cuda_visible_devices_maps_each_gpu_to_its_local_rank() -> None:
    ranks = JobLayout(1, 2).ranks()
    by_index = GpuRanks(ranks, visible="3,1")
    assert by_index.rank_of(gpu="1", uuid=None).rank == 1
    assert by_index.rank_of(gpu="3", uuid=None).rank == 0
    assert by_index.rank_of(gpu="0", uuid=None) is None  # a GPU the job does not see
    by_uuid = GpuRanks(ranks, visible="GPU-fake-0001,GPU-fake-0000")
    assert by_uuid.rank_of(gpu="0", uuid="GPU-fake-0000").rank == 1


def test_nvml_samples_name_the_rank_and_the_host_and_faults_become_findings() -> None:
    nvml = {"node0": FakeNVML(gpus=2), "node1": FakeNVML(gpus=2)}
    sources = HostSources(
        HostSourcesConfig(nvml=lambda node: nvml[node], host_counters=False),
        JobLayout(2, 2, 2),
    )
    first = sources.poll()
    temps = {(s.labels["rank"], s.labels["gpu"]) for s in first if s.name == "gpu_temp"}
    assert temps == {("0", "0"), ("1", "1"), ("2", "0"), ("3", "1")}
    assert {s.labels["host"] for s in first} == {HOST}
    assert {s.labels["source"] for s in first} == {"nvml"}
    assert findings_of(first) == []  # a healthy GPU is no finding
    sources.take()

    nvml["node1"].devices[1].throttle = 0x40  # hardware thermal slowdown on rank 3's GPU
    nvml["node1"].devices[0].ecc[1] = 2  # uncorrectable errors on rank 2's GPU
    nvml["node0"].inject_xid(0, 79)  # rank 0's GPU fell off the bus
    detectors = host_detectors()
    found = []
    for _ in range(2):  # a throttle is a fault once it holds two polls
        for frame in host_frames(sources.poll()):
            for detector in detectors:
                found += detector.process(frame)
    kinds = by_kind(found)
    assert [(f.subject.rank, f.subject.node) for f in kinds["thermal"]] == [(3, "node1")]
    assert [f.subject.rank for f in kinds["ecc"]] == [2]
    assert [(f.subject.rank, f.severity) for f in kinds["xid"]] == [(0, Severity.CRITICAL)]
    assert sources.gpu_of(3) == "1"
    sources.close()


def test_dcgm_exporter_text_over_http_maps_hostname_to_host_and_gpus_to_ranks() -> None:
    assert len(counter_list()) > 20  # the shipped list, every field of it served
    exporter = FakeDcgmExporter(HOST, gpus=2)
    with serving(exporter) as url:
        sources = HostSources(
            HostSourcesConfig(dcgm_url=url, host_counters=False, visible_devices="1,0"),
            JobLayout(1, 2),
        )
        first = sources.poll()
        temps = {s.labels["rank"]: s.value for s in first if s.name == "DCGM_FI_DEV_GPU_TEMP"}
        assert temps == {"0": 52.0, "1": 52.0}
        gpu1 = next(s for s in first if s.labels.get("gpu") == "1")
        assert gpu1.labels["rank"] == "0"
        assert gpu1.labels["host"] == HOST
        assert gpu1.labels["node"] == "node0"
        assert gpu1.labels["source"] == "dcgm"
        exporter.set(0, "DCGM_FI_DEV_XID_ERRORS", 48)  # a double-bit ECC error's XID
        exporter.set(1, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 0x20)
        rules = host_detectors()
        found = findings_of(sources.poll(), rules) + findings_of(sources.poll(), rules)
    kinds = by_kind(found)
    assert [(f.subject.rank, f.evidence["xid"]) for f in kinds["xid"]] == [(1, 48.0)]
    assert [f.subject.rank for f in kinds["thermal"]] == [0]
    assert exporter.scrapes == 3


def test_the_kernel_log_is_read_from_the_start_of_the_run(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    shutil.copy(FIXTURES / "telemetry" / "kmsg-xid.log", log)  # XIDs before the run
    nvml = FakeNVML(gpus=2)
    nvml.devices[1].bus_id = "00000000:3B:00.0"
    sources = HostSources(
        HostSourcesConfig(nvml=lambda node: nvml, kernel_log=str(log), host_counters=False),
        JobLayout(1, 2),
    )
    assert [s for s in sources.poll() if s.name == "gpu_xid"] == []
    with log.open("a") as f:
        f.write("[ 9001.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus.\n")
    xids = [s for s in sources.poll() if s.name == "gpu_xid"]
    assert [(s.value, s.labels["rank"], s.labels["source"]) for s in xids] == [
        (79.0, "1", "kernel_log")
    ]
    assert [f.subject.rank for f in findings_of(xids)] == [1]


def test_an_nccl_dump_names_the_rank_behind_as_a_hang(tmp_path: Path) -> None:
    dumps = tmp_path / "nccl"
    dumps.mkdir()
    sources = HostSources(
        HostSourcesConfig(nccl_dump_dir=str(dumps), host_counters=False), JobLayout(1, 3)
    )
    assert sources.poll() == []
    for rank in range(3):
        shutil.copy(FIXTURES / "nccl" / f"nccl_trace_rank_{rank}", dumps)
    found = findings_of(sources.poll())
    assert [(f.kind, f.subject.rank, f.detector) for f in found] == [
        ("hang", 1, "nccl_flight_record")
    ]
    assert sources.poll() == []  # a dump is read once


def test_host_counters_are_labelled_with_the_hostname() -> None:
    sources = HostSources(HostSourcesConfig(), JobLayout(1, 1))
    samples = sources.poll()
    assert any(s.name == "host_mem_total_bytes" for s in samples)
    assert {(s.labels["host"], s.labels["node"]) for s in samples} == {(HOST, "node0")}
