from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from collector._http import HTTPSourceError
from collector.prometheus_api import PrometheusClient, PrometheusQueryError
from ft_runtime.ports import free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    """The folder of canned inputs (exporter text, kernel logs, flight-recorder dumps)."""
    return FIXTURES


PROMETHEUS = shutil.which("prometheus")


@pytest.fixture(scope="session")
def exporter() -> Iterator[int]:
    registry = CollectorRegistry()
    temp = Gauge("ee_test_gpu_temp", "GPU temperature (C)", ["gpu"], registry=registry)
    temp.labels(gpu="0").set(41)
    temp.labels(gpu="1").set(77)
    Counter("ee_test_steps", "steps", registry=registry).inc(12)
    xid = Gauge(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        ["gpu", "Hostname"],
        registry=registry,
    )
    xid.labels(gpu="3", Hostname="gpu-node-07").set(79)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield int(server.server_port)
    server.shutdown()
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def prometheus(exporter: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is absent; run scripts/install-system-deps.sh")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = workdir / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: test\n    static_configs: [{{targets: ['127.0.0.1:{exporter}']}}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_series(url, proc, workdir / "log")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_series(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    client = PrometheusClient(url, timeout=2)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited: {log.read_text()[-2000:]}")
        try:
            if len(client.query("ee_test_gpu_temp")) == 2:
                return
        except (HTTPSourceError, PrometheusQueryError):
            pass
        time.sleep(0.3)
    pytest.fail("prometheus did not scrape the exporter within 40 s")
