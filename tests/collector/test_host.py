from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from collector.host import HostSource


def _by_name(samples: list) -> dict[str, float]:
    return {s.name: s.value for s in samples if "nic" not in s.labels}


def test_memory_and_disk_match_the_machine(tmp_path: Path) -> None:
    samples = HostSource(node="n1", disk_path=str(tmp_path), clock=lambda: 2.0).collect()
    values = _by_name(samples)
    assert values["host_mem_total_bytes"] == psutil.virtual_memory().total
    assert 0 < values["host_mem_used_bytes"] <= values["host_mem_total_bytes"]
    assert 0 <= values["host_disk_used_pct"] <= 100
    assert values["host_cpu_count"] == os.cpu_count()
    assert all(s.labels["node"] == "n1" and s.time == 2.0 for s in samples)
    assert "host_cpu_util_pct" not in values  # needs two polls


def test_cpu_utilisation_is_computed_between_polls() -> None:
    source = HostSource(node="n1")
    source.collect()
    end = psutil.cpu_times().user + 0.3
    while psutil.cpu_times().user < end:  # burn some CPU so the share is above zero
        sum(range(10000))
    values = _by_name(source.collect())
    assert 0 < values["host_cpu_util_pct"] <= 100
    assert 0 <= values["host_cpu_iowait_pct"] <= 100


def test_disk_write_counter_grows_when_we_write(tmp_path: Path) -> None:
    source = HostSource(node="n1", disk_path=str(tmp_path))
    before = _by_name(source.collect()).get("host_disk_written_bytes_total")
    if before is None:
        pytest.skip("this container exposes no disk I/O counters")
    blob = tmp_path / "blob"
    with blob.open("wb") as f:
        f.write(os.urandom(8 * 2**20))
        f.flush()
        os.fsync(f.fileno())
    after = _by_name(source.collect())["host_disk_written_bytes_total"]
    assert after >= before


def test_network_counters_per_nic_and_loopback_is_left_out() -> None:
    samples = HostSource(node="n1").collect()
    nics = {s.labels["nic"] for s in samples if "nic" in s.labels}
    assert "lo" not in nics
    assert nics == set(psutil.net_io_counters(pernic=True)) - {"lo"}
    only_lo = HostSource(node="n1", nics=["lo"]).collect()
    rx = [s for s in only_lo if s.name == "host_net_rx_bytes_total"]
    assert [s.labels["nic"] for s in rx] == ["lo"]


def test_a_failing_psutil_call_is_counted_not_raised(tmp_path: Path) -> None:
    source = HostSource(node="n1", disk_path=str(tmp_path / "absent"))
    values = _by_name(source.collect())
    assert "host_disk_used_pct" not in values
    assert "host_mem_total_bytes" in values
    assert source.dropped["psutil_error:disk"] == 1
