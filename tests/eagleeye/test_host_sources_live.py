"""A live `eagleeye run` reads its host's sources: the shipped fake NVML, a dcgm-exporter
served over HTTP and a kernel log. Once the job steps, GPU 1 (rank 1's) throttles for heat
and counts an uncorrectable ECC error (NVML), and the kernel log shows XID 31 on it; then
GPU 0 (rank 0's) reports XID 79 (NVML's event queue) and dcgm-exporter XID 48 on GPU 1.
Each is a finding on the right rank; a fatal XID restarts the job (the policy's answer);
the exporter's GPU and rank-info series are filled, with the real hostname."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from collector.testing import FakeNVML
from detectors.types import Finding
from eagleeye.launch import JobConfig, run_job
from eagleeye.store import RunReader
from ft_runtime.layout import JobLayout
from ft_runtime.ports import free_port
from tests.eagleeye.dcgm_server import FakeDcgmExporter, serving
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

HOST = socket.gethostname()
POLICY = """
[policy]
name = "gpu faults"
dry_run = false

[[rule]]
kind = "xid"
min_severity = "critical"
do = ["restart:job"]

[[rule]]
kind = "thermal"
do = ["notify:subject"]
"""


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def until(what: str, check, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen within {limit} s")


def test_gpu_faults_of_a_live_run_are_findings_on_the_right_rank(tmp_path: Path) -> None:
    nvml = FakeNVML(gpus=2)
    dcgm = FakeDcgmExporter(HOST, gpus=2)
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("[    1.0] NVRM: Xid (PCI:0000:18:00): 79, an XID before the run\n")
    (tmp_path / "policy.toml").write_text(POLICY)
    port = free_port()
    found: list[Finding] = []
    seen: dict[str, str] = {}

    def operator() -> None:
        """Waits for steps, then breaks the GPUs and reads the metrics meanwhile."""
        until("steps", lambda: "eagleeye_steps_total" in (t := scrape(port)) and step(t) >= 3)
        nvml.devices[1].throttle = 0x40  # hardware thermal slowdown
        nvml.devices[1].ecc[1] = 1
        with kernel_log.open("a") as f:
            f.write("[ 99.0] NVRM: Xid (PCI:0000:28:00): 31, pid=7, MMU Fault\n")
        until("the thermal finding", lambda: any(f.kind == "thermal" for f in found))
        nvml.inject_xid(0, 79)
        dcgm.set(1, "DCGM_FI_DEV_XID_ERRORS", 48)
        fatal = {79.0, 48.0}
        until("the fatal XIDs", lambda: fatal <= {f.evidence.get("xid") for f in found})
        seen["metrics"] = scrape(port)

    def step(text: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith("eagleeye_steps_total"))
        return float(line.split()[-1])

    with serving(dcgm) as url:
        config = JobConfig(
            script="eagleeye.workload.train",
            module=True,
            script_args=tiny_workload(300, 20),
            layout=JobLayout(1, 2),
            remediate=True,
            policy=str(tmp_path / "policy.toml"),
            runs_dir=str(tmp_path / "runs"),
            run_id="gpus",
            metrics_port=port,
            gpu_metrics=lambda node: nvml,
            dcgm_url=url,
            kernel_log=str(kernel_log),
            sources_period_s=0.25,
        )
        watcher = threading.Thread(target=operator, daemon=True)
        watcher.start()
        result = run_job(
            config, on_update=lambda item: found.append(item) if isinstance(item, Finding) else None
        )
        watcher.join(10)
    assert result.succeeded
    by_kind = {(f.kind, f.subject.rank, f.evidence.get("xid")) for f in found}
    assert ("thermal", 1, None) in by_kind  # NVML's throttle bits; GPU 1 is rank 1's
    assert ("ecc", 1, None) in by_kind  # NVML's uncorrectable count
    assert ("xid", 1, 31.0) in by_kind  # the kernel log, its PCI id through NVML
    assert ("xid", 0, 79.0) in by_kind  # NVML's event queue
    assert ("xid", 1, 48.0) in by_kind  # dcgm-exporter's sticky XID gauge
    xids = [(f.subject.rank, f.evidence["xid"]) for f in found if f.kind == "xid"]
    assert sorted(xids) == [(0, 79.0), (1, 31.0), (1, 48.0)]  # each once, on its rank

    metrics = seen["metrics"]
    assert f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{HOST}"' in metrics
    assert 'UUID="GPU-fake-0001",gpu="1",node="node0"' in metrics  # NVML's series
    info = [x for x in metrics.splitlines() if x.startswith("eagleeye_rank_info{")]
    # rank-info joined to its GPU (whose UUID the last source to read it gave)
    assert any('rank="1"' in x and 'gpu="1"' in x and 'uuid="GPU-' in x for x in info)

    with RunReader(result.run_dir) as run:
        actions = run.actions()
        temps = run.query("SELECT DISTINCT rank FROM samples WHERE name = 'gpu_temp'")
    restarts = actions[(actions["kind"] == "restart") & (actions["status"] == "done")]
    assert "xid" in set(restarts["finding_kind"])  # the fatal XID restarted the job
    assert set(temps["rank"]) == {0, 1}  # the GPUs' series are in the store, by rank
