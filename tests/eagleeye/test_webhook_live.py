"""`eagleeye run --webhook ADDR:PORT`: an Alertmanager alert on a DCGM metric, naming this
host by dcgm-exporter's ``Hostname`` and a GPU, lands on the rank using that GPU and is
remediated by the run's policy (a real HTTP POST, as Alertmanager sends it). A wrong token
is refused and never acted on."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from detectors.types import Finding
from eagleeye.cli import build_parser
from eagleeye.launch import JobConfig, _alerts, job_config_from_args, run_job
from eagleeye.store import RunReader
from ft_runtime.layout import JobLayout
from ft_runtime.ports import free_port
from tests.eagleeye.test_host_sources_live import scrape, until
from tests.workload_args import tiny_workload

HOST = socket.gethostname()
POLICY = """
[policy]
name = "alerts"
dry_run = false

[[rule]]
kind = "xid"
min_severity = "critical"
do = ["restart:job"]
"""


def step(metrics: str) -> float:
    """The steps the job completed, as its exporter says (0 before the first)."""
    for line in metrics.splitlines():
        if line.startswith("eagleeye_steps_total"):
            return float(line.split()[-1])
    return 0.0


def post(url: str, token: str, alerts: list[dict]) -> int:
    body = json.dumps({"version": "4", "status": "firing", "alerts": alerts}).encode()
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_webhook_flag_takes_an_address_and_a_port() -> None:
    args = build_parser().parse_args(
        ["run", "--webhook", "0.0.0.0:9300", "--webhook-token-file", "t", "x.py"]
    )
    config = job_config_from_args(args)
    assert (config.alerts_address, config.alerts_port, config.alerts_token_file) == (
        "0.0.0.0",
        9300,
        "t",
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--webhook", "no-port", "x.py"])


def test_the_runs_webhook_places_an_alert_on_this_hosts_rank_from_its_first_request(
    tmp_path: Path,
) -> None:
    (tmp_path / "token").write_text("alert-token\n")
    config = JobConfig(
        script="x.py",
        layout=JobLayout(1, 2),
        alerts_port=0,
        alerts_token_file=str(tmp_path / "token"),
    )
    alerts = _alerts(config, None)  # what run_job serves before the run exists
    assert alerts is not None
    try:
        labels = {"alertname": "A", "kind": "xid", "severity": "critical", "gpu": "1"}
        here = {**labels, "Hostname": HOST}
        there = {**labels, "Hostname": "another-host"}
        assert post(alerts.url, "alert-token", [{"labels": here}, {"labels": there}]) == 200
        placed = [(f.subject.rank, f.subject.node) for f in alerts.take()]
    finally:
        alerts.close()
    assert placed == [(1, "node0"), (None, "another-host")]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_dcgm_alert_naming_this_host_restarts_the_job_through_the_rank_of_its_gpu(
    tmp_path: Path,
) -> None:
    (tmp_path / "token").write_text("alert-token\n")
    (tmp_path / "policy.toml").write_text(POLICY)
    port, hook = free_port(), free_port()
    url = f"http://127.0.0.1:{hook}/alerts"
    alert = {
        "status": "firing",
        "labels": {
            "alertname": "EagleEyeGpuXidFatal",
            "kind": "xid",
            "severity": "critical",
            "Hostname": HOST,
            "gpu": "1",
            "DCGM_FI_DEV_XID_ERRORS": "79",
        },
        "annotations": {"value": "79"},
        "startsAt": "2026-11-26T10:00:00.123456789Z",
    }
    found: list[Finding] = []
    refused: list[int] = []

    def alertmanager() -> None:
        until("steps", lambda: step(scrape(port)) >= 3)
        refused.append(post(url, "wrong-token", [alert]))
        until("the webhook", lambda: post(url, "alert-token", [alert]) == 200)

    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=tiny_workload(120, 20),
        layout=JobLayout(1, 2),
        remediate=True,
        policy=str(tmp_path / "policy.toml"),
        runs_dir=str(tmp_path / "runs"),
        run_id="alerts",
        metrics_port=port,
        alerts_port=hook,
        alerts_token_file=str(tmp_path / "token"),
        host_counters=False,
    )
    sender = threading.Thread(target=alertmanager, daemon=True)
    sender.start()
    result = run_job(
        config, on_update=lambda i: found.append(i) if isinstance(i, Finding) else None
    )
    sender.join(10)
    assert result.succeeded
    assert refused == [401]
    alerted = [f for f in found if f.detector.startswith("alertmanager:")]
    assert [(f.subject.rank, f.subject.node) for f in alerted] == [(1, "node0")]
    with RunReader(result.run_dir) as run:
        actions = run.actions()
    restarts = actions[(actions["kind"] == "restart") & (actions["status"] == "done")]
    assert list(restarts["finding_kind"]) == ["xid"]
    assert list(restarts["finding_rank"]) == [1]
