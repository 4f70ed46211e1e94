"""A host evicted under replica recovery, through the real commands on loopback:
`eagleeye controller --recovery replica --replicas 2`, agents for node ranks 0 and 1 (one
replica each; node rank 1's names its host ``host-b`` and reads a dcgm-exporter the test
serves) and a spare.

A fatal XID on host B's GPU (dcgm-exporter's XID gauge), or an Alertmanager alert naming
host B, is an ``xid`` finding on host B's rank; with ``--remediate`` the built-in policy
evicts host B: only replica 1 restarts, on the spare, and catches up from replica 0, whose
rank keeps its pid; the job succeeds; host B's agent ends, saying how to readmit the host,
and a spare on host B is refused unless started with ``--readmit``. Without
``--remediate`` the eviction is decided and recorded only: nothing is evicted and both
replicas train on to the end. With no spare, host B is evicted all the same and replica 0
trains on alone to the end. No process of the job is left after any test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from ft_runtime.ports import free_port
from tests.eagleeye.cluster_replica_helpers import steps
from tests.eagleeye.dcgm_server import FakeDcgmExporter, serving
from tests.eagleeye.test_cluster_remediation import TOKEN, xid_alert
from tests.eagleeye.test_cluster_replicas import Job, running
from tests.eagleeye.test_webhook_live import post

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

HOST_B = ("--hostname", "host-b")
XID = "DCGM_FI_DEV_XID_ERRORS"


def dcgm_flags(url: str) -> tuple[str, ...]:
    """Host B's agent reads its GPU from the test's dcgm-exporter."""
    return (*HOST_B, "--dcgm-url", url, "--gpu-metrics", "off", "--sources-period", "0.2")


@contextmanager
def faulty_b(
    tmp_path: Path, controller: tuple[str, ...] = ("--remediate",), spare: bool = True
) -> Iterator[Job]:
    """The job started, host B's agent reading the test's dcgm-exporter; then host B's
    GPU reports XID 79 (fallen off the bus). Every process is ended after."""
    dcgm = FakeDcgmExporter("host-b", gpus=1)
    with serving(dcgm) as url:
        job = Job(tmp_path, controller)
        try:
            job.start(spare=spare, host_b=dcgm_flags(url))
            dcgm.set(0, XID, 79)
            yield job
        finally:
            job.close()


def evicted_b(job: Job) -> None:
    """Host B's XID finding on its rank, then its agent evicted (its host named)."""
    finding = job.lines.next(lambda i: i.get("type") == "Finding")
    assert finding["kind"] == "xid", finding
    assert (finding["subject"]["rank"], finding["subject"]["node"]) == (1, "node1")
    evicted = job.lines.next(lambda i: i.get("phase") == "evicted")
    assert evicted["subject"] == f"agent:{job.first[1]['agent']}"
    assert evicted["detail"]["host"] == "host-b"


def readmission(job: Job) -> None:
    """A spare on the evicted host B is refused, saying how to readmit it; one started
    with --readmit is admitted, the eviction's cause recorded with it."""
    plain = job.agent(["--spare", *HOST_B], "plain")
    assert plain.wait(timeout=60) == 2
    refused = (job.tmp / "plain.err").read_text()
    assert "eagleeye agent: refused by the controller: host host-b was evicted" in refused
    assert "--spare --readmit" in refused
    job.agent(["--spare", "--readmit", *HOST_B], "readmitted")
    admitted = job.lines.next(lambda i: i.get("phase") == "running" and "readmitted" in i["detail"])
    assert "host host-b (node1) evicted: xid" in admitted["detail"]["readmitted"]


def ended_as_told(job: Job) -> None:
    """Every agent ended 0 (the spare that took node rank 1, node rank 0's, host B's
    evicted one, the readmitted spare), host B's saying why and how to readmit it."""
    codes = [proc.wait(timeout=60) for proc in job.agents]
    assert codes == [0, 0, 0, 2, 0]  # the refused spare: 2
    said = (job.tmp / "logs1.err").read_text()
    assert "evicted by the controller (host host-b (node1) evicted: xid" in said
    assert "readmit it as a spare with eagleeye agent --spare --readmit" in said


def test_a_fatal_xid_evicts_its_host_and_only_its_replica_moves_to_the_spare(
    tmp_path: Path,
) -> None:
    with faulty_b(tmp_path) as job:
        evicted_b(job)
        at_loss = steps(job.healthy)[-1]
        moved = job.rejoined(at_loss)
        assert moved["agent"].endswith("-spare")
        readmission(job)
        job.finished()
        ended_as_told(job)
    done = job.moved_to_spare(at_loss, moved, ["xid"])
    assert f"node rank 1 moved to the spare {moved['agent']}" in done
    with RunReader(tmp_path / "runs" / "r") as run:
        targets = run.query("SELECT target FROM actions")
    assert list(targets["target"]) == ["node:node1"]


def test_an_alert_naming_host_b_evicts_it_and_only_its_replica_moves(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    hook = free_port()
    webhook = ("--webhook", f"127.0.0.1:{hook}", "--webhook-token-file", str(tmp_path / "token"))
    job = Job(tmp_path, ("--remediate", *webhook))
    try:
        job.start(host_b=HOST_B)
        alerts = f"http://127.0.0.1:{hook}/alerts"
        assert post(alerts, TOKEN, [xid_alert("host-z")]) == 200  # no agent there
        unknown = job.lines.next(lambda i: i.get("type") == "Finding")
        assert (unknown["kind"], unknown["subject"]["node"]) == ("xid", "host-z")
        assert post(alerts, TOKEN, [xid_alert("host-b")]) == 200
        evicted_b(job)
        at_loss = steps(job.healthy)[-1]
        moved = job.rejoined(at_loss)
        assert moved["agent"].endswith("-spare")
        # host B is out of the job: a later alert naming it is recorded, not placed on
        # node rank 1 (now the spare's), and nothing acts on it
        assert post(alerts, TOKEN, [xid_alert("host-b")]) == 200
        again = job.lines.next(lambda i: i.get("type") == "Finding")
        assert (again["subject"]["rank"], again["subject"]["node"]) == (None, "host-b")
        job.finished()
        assert [proc.wait(timeout=60) for proc in job.agents] == [0, 0, 0]
        assert "evicted by the controller (host host-b" in (tmp_path / "logs1.err").read_text()
    finally:
        job.close()
    job.moved_to_spare(at_loss, moved, ["xid"] * 3)  # host-z's and the late one: recorded
    with RunReader(tmp_path / "runs" / "r") as run:
        nodes = run.query("SELECT node FROM findings WHERE kind = 'xid' ORDER BY id")
    assert list(nodes["node"]) == ["host-z", "node1", "host-b"]


def test_without_remediate_the_eviction_is_only_decided_and_both_replicas_train_on(
    tmp_path: Path,
) -> None:
    with faulty_b(tmp_path, controller=()) as job:
        decision = job.lines.next(lambda i: i.get("type") == "Decision")
        assert decision["finding"]["kind"] == "xid"
        assert (decision["dry_run"], decision["outcome"]["status"]) == (True, "skipped")
        job.finished()
        assert [proc.wait(timeout=60) for proc in job.agents] == [0, 0, 0]
    assert "evicted" not in (tmp_path / "logs1.err").read_text()
    survived = steps(job.healthy)
    assert survived == list(range(survived[0], survived[-1] + 1))
    assert steps(tmp_path / "logs1" / "replica-1-0" / "rank-1.log")[-1] == survived[-1]
    for rank in (0, 1):  # neither rank started again
        started = [i["detail"]["pid"] for i in job.lines.seen if running(rank)(i)]
        assert started == [job.first[rank]["pid"]]
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.actions()
        events = run.events()
    assert list(zip(actions["kind"], actions["status"], actions["dry_run"], strict=True)) == [
        ("evict", "skipped", 1)
    ]
    assert "evicted" not in set(events["phase"])
    job.no_rank_left(job.first[0]["pid"], job.first[1]["pid"])


def test_with_no_spare_the_evicted_hosts_replica_ends_and_the_other_goes_on(
    tmp_path: Path,
) -> None:
    with faulty_b(tmp_path, spare=False) as job:
        finding = job.lines.next(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("xid", 1)
        job.went_on_alone(steps(job.healthy)[-1])
        assert [proc.wait(timeout=60) for proc in job.agents] == [0, 0]
    assert "evicted by the controller (host host-b" in (tmp_path / "logs1.err").read_text()
    job.alone(["xid"])
