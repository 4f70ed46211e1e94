"""Injected fault → exporter → Prometheus alert → Alertmanager → webhook → action executed.

Real servers (Debian's prometheus and prometheus-alertmanager) on loopback ports, short
scrape, evaluation and group intervals; the action lands on ft_runtime's FakeRuntime.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector._http import HTTPSourceError
from collector.prometheus_api import PrometheusClient, PrometheusQueryError
from eagleeye.alerting import AlertWebhook, Windows, write_alertmanager_config, write_rules
from eagleeye.exporter import EagleEyeExporter
from ft_runtime.ports import free_port
from ft_runtime.testing import FakeRuntime
from ft_runtime.types import ActionKind
from remediation import Hooks, Remediator, load_policy
from tests.alerting.conftest import ALERTMANAGER, PROMETHEUS, need

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DEFAULT_POLICY = Path(__file__).resolve().parents[2] / "remediation" / "policies" / "default.toml"


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("w"))


def start_servers(
    tmp_path: Path, alertmanager: str, am_port: int, prometheus: str, prom_port: int
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """Alertmanager and Prometheus on loopback, from am.yml and prom.yml in ``tmp_path``;
    each with its log."""
    am = start(
        [
            alertmanager,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ],
        tmp_path / "am.log",
    )
    prom = start(
        [
            prometheus,
            f"--config.file={tmp_path / 'prom.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        tmp_path / "prom.log",
    )
    return [(am, tmp_path / "am.log"), (prom, tmp_path / "prom.log")]


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait(what: str, ready, procs: list[tuple[subprocess.Popen[bytes], Path]], limit=40) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for proc, log in procs:
            if proc.poll() is not None:
                pytest.fail(f"{proc.args[0]} exited: {log.read_text()[-2000:]}")
        try:
            if ready():
                return
        except (OSError, HTTPSourceError, PrometheusQueryError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{what} not ready within {limit} s")


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[EagleEyeExporter, FakeRuntime, str]]:
    prometheus = need(PROMETHEUS, "prometheus")
    alertmanager = need(ALERTMANAGER, "prometheus-alertmanager")
    runtime = FakeRuntime()
    policy = load_policy(DEFAULT_POLICY)
    remediator = Remediator(policy, runtime, dry_run=False, hooks=Hooks())
    (tmp_path / "token").write_text("e2e-token\n")
    webhook = AlertWebhook(remediator.handle, token="e2e-token").start()
    exporter = EagleEyeExporter(run="e2e")
    exporter.observe_xid("n1", "0", 0)  # the gauge exists before the fault: changes() sees it
    server, thread = exporter.serve(0)
    am_port, prom_port = free_port(), free_port()
    write_alertmanager_config(
        tmp_path / "am.yml",
        webhook_url=webhook.url,
        credentials_file=tmp_path / "token",
        group_wait="0s",
    )
    write_rules(tmp_path / "rules.yml", Windows(change="30s"))
    (tmp_path / "prom.yml").write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "200ms", "evaluation_interval": "200ms"},
                "rule_files": ["rules.yml"],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
                },
                "scrape_configs": [
                    {
                        "job_name": "eagleeye",
                        "static_configs": [{"targets": [f"127.0.0.1:{server.server_port}"]}],
                    }
                ],
            }
        )
    )
    procs = start_servers(tmp_path, alertmanager, am_port, prometheus, prom_port)
    client = PrometheusClient(f"http://127.0.0.1:{prom_port}", timeout=2)
    try:
        wait("alertmanager", lambda: http_ok(f"http://127.0.0.1:{am_port}/-/ready"), procs)
        # Two scrapes of the healthy gauge, so the change to the XID is a change.
        wait("prometheus", lambda: len(client.query("DCGM_FI_DEV_XID_ERRORS[1s]")) >= 2, procs)
        yield exporter, runtime, f"http://127.0.0.1:{am_port}"
    finally:
        for proc, _ in procs:
            stop(proc)
        server.shutdown()
        thread.join(timeout=5)
        webhook.stop()


@pytest.mark.timeout(120)
def test_an_xid_on_the_exporter_evicts_the_node_through_alertmanager(stack) -> None:
    exporter, runtime, _ = stack
    time.sleep(0.5)
    assert runtime.actions == []  # a healthy GPU raises nothing
    injected = time.monotonic()
    exporter.observe_xid("n1", "0", 79)  # the fault: GPU 0 of n1 fell off the bus
    deadline = injected + 30
    while time.monotonic() < deadline and not any(
        a.kind is ActionKind.EVICT for a in runtime.actions
    ):
        time.sleep(0.02)
    elapsed = time.monotonic() - injected
    while time.monotonic() < deadline and not any(  # the rung's last step, a moment later
        a.kind is ActionKind.RESTART for a in runtime.actions
    ):
        time.sleep(0.02)
    evictions = [a for a in runtime.actions if a.kind is ActionKind.EVICT]
    assert [a.target for a in evictions] == ["node:n1"], runtime.actions
    kinds = [a.kind for a in runtime.actions]
    assert kinds[:3] == [ActionKind.CHECKPOINT, ActionKind.EVICT, ActionKind.RESTART]
    print(f"\nfault to eviction through Prometheus and Alertmanager: {elapsed:.2f} s")
    assert elapsed < 30
    # Later re-sends of the same alert execute nothing new.
    time.sleep(1.0)
    assert sum(a.kind is ActionKind.EVICT for a in runtime.actions) == 1
