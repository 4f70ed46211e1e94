"""`eagleeye controller` answers its findings with the remediation policy, serves the
exporter and Alertmanager's webhook, as `eagleeye run` does (loopback, two agents; the
second names its host ``host-b``, as dcgm-exporter's ``Hostname`` would).

An alert on a DCGM XID naming host B lands on host B's rank using that GPU: with
``--remediate`` the built-in policy evicts host B (no spare: the job stops), and a policy
file that restarts instead restarts the job on both agents; without ``--remediate`` the
eviction is only decided (a dry run) and the job trains on to its end; a failed rank's
restart is decided too, and the job fails, as `eagleeye run`'s does. An alert naming a
host no agent runs on is recorded and never acted on; one without the token is refused.
The exporter answers with the job's series under the run's label, the rank on host B
named with its hostname and GPU, and the GPU series host B's agent forwards from its
dcgm-exporter."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagleeye.store import RunReader
from ft_runtime.ports import free_port
from tests.eagleeye.dcgm_server import FakeDcgmExporter, serving
from tests.eagleeye.test_cluster_cli import Cluster
from tests.eagleeye.test_host_sources_live import scrape, until
from tests.eagleeye.test_webhook_live import post, step

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(200)]

STEPPING = """
import sys, time
import eagleeye
ee = eagleeye.init()
end, i = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    ee.step_start(i)
    time.sleep(0.05)
    ee.step_end(i, loss=1.0)
    i += 1
ee.close()
"""
RESTART_ON_XID = """
[policy]
name = "xid-restarts"

[[rule]]
kind = "xid"
min_severity = "critical"
do = ["restart:job"]
"""
TOKEN = "alert-token"


def xid_alert(host: str) -> dict:
    labels = {
        "alertname": "EagleEyeGpuXidFatal",
        "kind": "xid",
        "severity": "critical",
        "Hostname": host,
        "gpu": "0",
    }
    return {"labels": labels, "annotations": {"value": "79"}}


class Served(Cluster):
    """A controller with its webhook and exporter on free loopback ports, the second agent
    on "host-b"."""

    def __init__(
        self, tmp: Path, seconds: str, controller: tuple[str, ...] = (), dcgm: str = ""
    ) -> None:
        (tmp / "token").write_text(TOKEN + "\n")
        self.hook, self.metrics = free_port(), free_port()
        served = ("--webhook", f"127.0.0.1:{self.hook}", "--webhook-token-file", str(tmp / "token"))
        served += ("--metrics-port", str(self.metrics))
        extra = ("--hostname", "host-b")
        if dcgm:  # host B's GPU, read by its agent from a dcgm-exporter
            extra += ("--dcgm-url", dcgm, "--gpu-metrics", "off", "--sources-period", "0.2")
        super().__init__(tmp, seconds, extra, script=STEPPING, controller=(*served, *controller))

    def alert(self, host: str, token: str = TOKEN) -> int:
        return post(f"http://127.0.0.1:{self.hook}/alerts", token, [xid_alert(host)])

    def actions(self) -> list[tuple[str, str, str, int, str]]:
        with RunReader(self.tmp / "runs" / "r") as run:
            rows = run.query(
                "SELECT a.kind, a.target, a.status, a.dry_run, f.node FROM actions a "
                "JOIN findings f ON f.id = a.finding_id ORDER BY a.id"
            )
        return list(zip(*(rows[c] for c in rows.columns), strict=True))


def test_an_alert_on_host_b_evicts_it_with_remediate_and_the_exporter_serves_the_job(
    tmp_path: Path,
) -> None:
    with serving(FakeDcgmExporter("host-b", gpus=1)) as dcgm:
        cluster = Served(tmp_path, "60", ("--remediate",), dcgm)
        try:
            served(cluster)
        finally:
            cluster.close()
    assert cluster.actions() == [("evict", "node:node1", "done", 0, "node1")]
    with RunReader(tmp_path / "runs" / "r") as run:
        nodes = run.query("SELECT node FROM findings WHERE kind = 'xid' ORDER BY id")
    assert list(nodes["node"]) == ["host-z", "node1"]
    cluster.no_rank_left()


def served(cluster: Served) -> None:
    """The exporter while the job trains, then the alerts: a wrong token, a host no agent
    runs on, host B's XID (which evicts it)."""
    cluster.launched({0, 1}, 0)
    until("the job's steps", lambda: step(scrape(cluster.metrics)) >= 3)
    gpu = 'DCGM_FI_DEV_GPU_TEMP{Hostname="host-b"'
    until("host B's GPU", lambda: gpu in scrape(cluster.metrics))
    text = scrape(cluster.metrics)
    assert 'eagleeye_run_active{run="r"} 1.0' in text
    info = [line for line in text.splitlines() if line.startswith("eagleeye_rank_info{")]
    rank1 = ('hostname="host-b"', 'rank="1"', 'gpu="0"', 'uuid="GPU-dcgm-0000"')
    assert any(all(label in line for label in rank1) for line in info), info
    assert cluster.alert("host-b", token="wrong") == 401  # refused, never acted on
    assert cluster.alert("host-z") == 200  # no agent there: recorded only
    unknown = cluster.read(lambda i: i.get("type") == "Finding")
    assert (unknown["kind"], unknown["subject"]["node"]) == ("xid", "host-z")
    assert cluster.alert("host-b") == 200
    finding = cluster.read(lambda i: i.get("type") == "Finding")
    assert (finding["subject"]["rank"], finding["subject"]["node"]) == (1, "node1")
    end = cluster.ended()  # host B evicted; with no spare, the job stops
    assert end["phase"] == "failed"
    assert "host-b (node1) evicted: xid" in end["detail"]["reason"]
    assert cluster.controller.wait(timeout=30) == 1
    assert [a.wait(timeout=30) for a in cluster.agents] == [0, 0]


def test_without_remediate_the_eviction_is_only_decided_and_the_job_trains_on(
    tmp_path: Path,
) -> None:
    cluster = Served(tmp_path, "6")
    try:
        cluster.launched({0, 1}, 0)
        assert cluster.alert("host-b") == 200
        decision = cluster.read(lambda i: i.get("type") == "Decision")
        assert (decision["dry_run"], decision["outcome"]["status"]) == (True, "skipped")
        assert cluster.ended()["phase"] == "succeeded"
        assert cluster.controller.wait(timeout=30) == 0
    finally:
        cluster.close()
    assert cluster.actions() == [("evict", "node:node1", "skipped", 1, "node1")]
    cluster.no_rank_left()


def test_a_policy_that_restarts_on_an_xid_restarts_the_job_on_both_agents(
    tmp_path: Path,
) -> None:
    (tmp_path / "policy.toml").write_text(RESTART_ON_XID)
    cluster = Served(tmp_path, "4", ("--remediate", "--policy", str(tmp_path / "policy.toml")))
    try:
        cluster.launched({0, 1}, 0)
        assert cluster.alert("host-b") == 200
        cluster.launched({0, 1}, 1)  # every agent restarted its ranks as attempt 1
        assert cluster.ended()["phase"] == "succeeded"
        assert cluster.controller.wait(timeout=30) == 0
    finally:
        cluster.close()
    assert cluster.actions() == [("restart", "job", "done", 0, "node1")]
    cluster.no_rank_left()


def test_without_remediate_a_failed_ranks_restart_is_decided_and_the_job_fails(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, "0.5")  # rank 1 exits 3 in its first attempt
    try:
        finding = cluster.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("process_exit", 1)
        end = cluster.ended()
        assert end["phase"] == "failed"
        assert end["detail"]["reason"] == "rank 1 exited 3 and no recovery was run"
        assert cluster.controller.wait(timeout=30) == 1
    finally:
        cluster.close()
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.actions()
    assert list(zip(actions["kind"], actions["dry_run"], strict=True)) == [("restart", 1)]
    assert not (tmp_path / "logs1" / "attempt-1").exists()
    cluster.no_rank_left()
