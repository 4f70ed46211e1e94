"""What an operator sees, end to end: two real `eagleeye run` jobs with injected faults,
scraped by a real Prometheus evaluating the shipped rules, alerting through a real
Alertmanager into Eagle Eye's webhook.

Job A hangs (a rank SIGSTOPped, not remediated); job B has a slow rank, polls its GPUs
through the shipped fake NVML and hangs too, then gets a fatal XID. The test checks that
each hang is one stalled-training alert per job (two jobs: two alerts), with the stopped
rank named, that stays firing for twice the window after which the old finding alert
resolved; that the XID alert reaches job B's own webhook (`--alerts-port`) and its policy
restarts the job; that every panel query of the exported Grafana dashboard returns data;
and that each hang alert resolves once its job steps again (A: the rank continues; B:
the restart).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.prometheus_api import PrometheusClient
from collector.testing import FakeNVML
from eagleeye import grafana
from eagleeye.alerting import Windows, write_alertmanager_config, write_rules
from eagleeye.launch import JobConfig, JobResult, run_job
from eagleeye.store import RunReader
from ft_runtime.layout import JobLayout
from ft_runtime.ports import free_port
from ft_runtime.types import LifecycleEvent, Phase
from tests.alerting.conftest import ALERTMANAGER, PROMETHEUS, need
from tests.alerting.test_end_to_end import http_ok, start_servers, stop, wait

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]
# Short windows, so that the test takes a minute: the old finding alert was a pulse as long
# as its window (CHANGE); the hang must outlast twice that and still fire.
WINDOWS = Windows(stall="4s", change="8s", sustain="8s", down="5s", absent="1m")
CHANGE_S = 8.0
STOP_AT = 25
# Job B's policy: a fatal XID restarts the job; hangs are left alone (as in job A).
XID_POLICY = """
[policy]
name = "xid restarts"
dry_run = false

[[rule]]
kind = "xid"
min_severity = "critical"
do = ["restart:job"]
"""


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


class Job:
    """One `eagleeye run` on a thread; remembers its ranks' pids."""

    def __init__(
        self, name: str, tmp: Path, inject: tuple[str, ...], gpus: bool, alerts: bool
    ) -> None:
        self.name = name
        self.port = free_port()
        self.alerts_port = free_port()
        policy = tmp / f"policy-{name}.toml"
        policy.write_text(XID_POLICY)
        self.pids: dict[str, int] = {}
        self.nvml = {"node0": FakeNVML(gpus=2)}
        self.result: list[JobResult] = []
        self.config = JobConfig(
            script="eagleeye.workload.train",
            module=True,
            script_args=[
                *("--preset", "tiny", "--steps", "60", "--batch-size", "2"),
                *("--block-size", "32", "--checkpoint-every", "10", "--timeout-s", "200"),
            ],
            layout=JobLayout(1, 2, 1),
            remediate=False,  # the hang is not remediated: it lasts until we resume the rank
            inject=inject,
            runs_dir=str(tmp / name),
            run_id=f"run-{name}",
            metrics_port=self.port,
            gpu_metrics=(lambda node: self.nvml[node]) if gpus else None,
            gpu_findings=False,  # the XID reaches the run through Alertmanager only
            policy=str(policy) if alerts else None,
            alerts_port=self.alerts_port if alerts else None,
            alerts_token_file=str(tmp / "alert.token") if alerts else None,
        )
        self.thread = threading.Thread(target=self._run, name=f"job-{name}", daemon=True)

    def _run(self) -> None:
        self.result.append(run_job(self.config, on_update=self._seen))

    def _seen(self, item: object) -> None:
        if isinstance(item, LifecycleEvent) and item.phase is Phase.LAUNCH and "pid" in item.detail:
            self.pids[item.subject] = int(item.detail["pid"])

    def resume(self) -> None:
        os.kill(self.pids["rank:1"], signal.SIGCONT)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    prometheus = need(PROMETHEUS, "prometheus")
    alertmanager = need(ALERTMANAGER, "prometheus-alertmanager")
    (tmp_path / "alert.token").write_text("alert-token\n")
    slow = "slow:rank=1@step=3,seconds=0.15"
    jobs = [
        Job("a", tmp_path, (f"stop:rank=1@step={STOP_AT}",), gpus=False, alerts=False),
        Job("b", tmp_path, (slow, f"stop:rank=1@step={STOP_AT}"), gpus=True, alerts=True),
    ]
    am_port, prom_port = free_port(), free_port()
    write_alertmanager_config(  # remediate="true" alerts go to job B's own webhook
        tmp_path / "am.yml",
        webhook_url=f"http://127.0.0.1:{jobs[1].alerts_port}/alerts",
        credentials_file=tmp_path / "alert.token",
        group_wait="0s",
        group_interval="1s",
    )
    write_rules(tmp_path / "rules.yml", WINDOWS)
    (tmp_path / "prom.yml").write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
                "rule_files": ["rules.yml"],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
                },
                "scrape_configs": [
                    {
                        "job_name": "eagleeye",
                        "static_configs": [{"targets": [f"127.0.0.1:{job.port}" for job in jobs]}],
                    }
                ],
            }
        )
    )
    procs = start_servers(tmp_path, alertmanager, am_port, prometheus, prom_port)
    prom_url, am_url = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}"
    try:
        wait("alertmanager", lambda: http_ok(f"{am_url}/-/ready"), procs)
        wait("prometheus", lambda: http_ok(f"{prom_url}/-/ready"), procs)
        for job in jobs:
            job.thread.start()
        yield {
            "jobs": jobs,
            "prom": PrometheusClient(prom_url, timeout=5),
            "prom_url": prom_url,
            "am_url": am_url,
            "procs": procs,
        }
    finally:
        for job in jobs:  # a failed test must not leave a stopped rank behind
            for pid in job.pids.values():
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        for job in jobs:
            job.thread.join(120)
        for proc, _ in procs:
            stop(proc)


def until(what: str, check: Callable[[], bool], limit: float = 90.0) -> float:
    """Waits for ``check``; returns when it became true (monotonic seconds)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if check():
                return time.monotonic()
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.25)
    pytest.fail(f"{what} not seen within {limit} s")


def firing(prom_url: str, alertname: str) -> dict[str, dict[str, str]]:
    """Prometheus's firing alerts of one name, by run."""
    alerts = get_json(f"{prom_url}/api/v1/alerts")["data"]["alerts"]
    return {
        a["labels"].get("run", ""): a["labels"]
        for a in alerts
        if a["labels"]["alertname"] == alertname and a["state"] == "firing"
    }


def test_an_operator_sees_hangs_an_xid_and_every_panel(stack) -> None:
    jobs, prom, prom_url, am_url = stack["jobs"], stack["prom"], stack["prom_url"], stack["am_url"]
    a, b = jobs
    stalled = "EagleEyeTrainingStalled"

    # Both jobs stop at the same step: one alert per job, not one merged alert.
    began = until("both hangs firing", lambda: set(firing(prom_url, stalled)) == {"run-a", "run-b"})
    am_alerts = [
        x["labels"]
        for x in get_json(f"{am_url}/api/v2/alerts?active=true")
        if x["labels"]["alertname"] == stalled
    ]
    assert sorted(x["run"] for x in am_alerts) == ["run-a", "run-b"]
    assert all(x["job"] == "eagleeye" and x["severity"] == "critical" for x in am_alerts)

    # The culprit is named: each job's stopped rank, with its host.
    until(
        "the culprits named",
        lambda: set(firing(prom_url, "EagleEyeRankStopped")) == {"run-a", "run-b"},
        30,
    )
    for labels in firing(prom_url, "EagleEyeRankStopped").values():
        assert labels["rank"] == "1"
        assert labels["state"] == "stopped"
        assert labels["hostname"] == labels["Hostname"] != ""

    # The straggler is visible: job B's slowed rank computes longer than its peer.
    compute = {
        s.labels["rank"]: s.value for s in prom.query('eagleeye_rank_compute_seconds{run="run-b"}')
    }
    assert compute["1"] > compute["0"] + 0.05  # slowed by 0.15 s: a third of it is noise room

    # Still stuck twice the old pulse after the alert began: still firing. The old pulse
    # ended after CHANGE_S and stayed off; a look may miss once or twice when one of the
    # half-second scrapes of this busy process runs late (its series then go stale).
    looks = []
    while time.monotonic() < began + 2 * CHANGE_S + 1:
        looks.append(set(firing(prom_url, stalled)) == {"run-a", "run-b"})
        time.sleep(0.5)
    assert looks[-1], looks
    assert looks.count(False) <= 2, looks

    # A fatal XID on job B's GPU 0, through the fake NVML its run polls: Prometheus,
    # Alertmanager, job B's webhook, and job B's policy restarts the job.
    injected = time.monotonic()
    b.nvml["node0"].inject_xid(0, 79)
    restarted = until(
        "job B's restart for the XID",
        lambda: any(
            s.value >= 1
            for s in prom.query('eagleeye_actions_total{run="run-b",kind="restart",status="done"}')
        ),
    )
    print(f"\nXID in the fake NVML to job B's restart: {restarted - injected:.2f} s")

    # Every panel of the exported dashboard has data (variables at All); the XID counter's
    # increase needs a second scrape after the XID, so this may take a moment.
    board = grafana.build_dashboard()

    def empty_panels() -> list[tuple[str, str]]:
        return [
            (title, expr)
            for title, expr in grafana.panel_queries(board)
            if not prom.query(grafana.expand(expr))
        ]

    deadline = time.monotonic() + 10
    while empty_panels() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert empty_panels() == []

    # Recovery: job B steps again after its restart, job A once its rank continues.
    until("job B's hang resolved", lambda: "run-b" not in firing(prom_url, stalled), 60)
    assert "run-a" in firing(prom_url, stalled)  # the other job is still stuck
    resumed = time.monotonic()
    a.resume()
    resolved = until("job A's hang resolved", lambda: not firing(prom_url, stalled), 30)
    print(f"rank resumed to the stalled-training alert resolved: {resolved - resumed:.2f} s")
    for job in jobs:
        job.thread.join(120)
        assert job.result, f"job {job.name} did not end"
        assert job.result[0].succeeded

    # Job B's store holds the alert as a finding and the restart that answered it.
    reader = RunReader(b.result[0].run_dir)
    try:
        findings, actions = reader.findings(), reader.actions()
    finally:
        reader.close()
    xid = findings[findings["kind"] == "xid"]
    assert list(xid["detector"]) == ["alertmanager:GpuXidFatal"]  # once, though re-sent
    assert xid.iloc[0]["evidence"]["value"] == 79.0
    answered = actions[actions["finding_id"] == xid.iloc[0]["id"]]
    assert list(zip(answered["kind"], answered["status"], strict=True)) == [("restart", "done")]
