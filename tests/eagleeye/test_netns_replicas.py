"""Replicas across hosts with a host lost: `eagleeye controller --recovery replica
--replicas 2` on one host, agents for node ranks 0 and 1 (one replica each) on two others
and a spare (`eagleeye agent --spare`) on a fourth (network namespaces on a bridge).
Every process of host B's namespace is killed: a `host_lost` finding, the spare takes
node rank 1 and only replica 1 restarts there, catching up from replica 0 peer to peer
(its catch-up server on host A's address); replica 0's rank keeps its pid and keeps
stepping throughout. The job succeeds and no process is left on any host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.cluster_replica_helpers import SCRIPT, answered, steps
from tests.eagleeye.test_netns_spare import Lines
from tests.netns import NetHosts, need_netns

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
EAGLEEYE = [sys.executable, "-m", "eagleeye"]


def running(rank: int) -> Callable[[dict[str, Any]], bool]:
    """A rank's process started by an agent (its pid and agent)."""
    return lambda i: (
        i.get("subject") == f"rank:{rank}" and i.get("phase") == "running" and "pid" in i["detail"]
    )


def wait_for(check: Callable[[], bool], what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


class ReplicaJob:
    """`eagleeye controller --recovery replica --replicas 2` on host 0, a spare on host 3,
    then the agents of node ranks 0 and 1 on hosts 1 and 2 (one replica each), each
    rank's process started (``first``: rank → its start's detail)."""

    def __init__(self, tmp_path: Path, hosts: NetHosts, port: int, run_id: str) -> None:
        (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        self.tmp, self.hosts, self.script = tmp_path, hosts, script
        self.finish = tmp_path / "finish"
        self.seen: list[dict[str, Any]] = []
        self.listen = f"{hosts.addresses[0]}:{port}"
        self.argv = (
            [*EAGLEEYE, "controller", "--listen", self.listen, "--nnodes", "2", "--remediate"]
            + ["--recovery", "replica", "--replicas", "2", "--heartbeat", "0.5"]
            + ["--secret-file", str(tmp_path / "secret"), "--runs-dir", str(tmp_path / "runs")]
            + ["--run-id", run_id]
        )
        self.controller = hosts.popen(
            0, self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.lines = Lines(self.controller)
        self.next_line(lambda i: "listening" in i)
        self.spare = self._agent(3, ["--spare"])
        self.next_line(lambda i: i.get("phase") == "running" and i["detail"].get("spare"))
        self.a, self.b = self._agent(1, ["--node-rank", "0"]), self._agent(2, ["--node-rank", "1"])
        self.first: dict[int, dict[str, Any]] = {}
        while len(self.first) < 2:  # each rank's process started by its agent, in any order
            item = self.next_line(lambda i: running(0)(i) or running(1)(i))
            self.first[int(item["subject"].removeprefix("rank:"))] = item["detail"]

    def next_line(self, want: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The controller's next line ``want`` takes (every line read is kept in ``seen``)."""

        def kept(item: dict[str, Any]) -> bool:
            self.seen.append(item)
            return want(item)

        return self.lines.next(kept)

    def _agent(self, host: int, role: list[str]) -> subprocess.Popen[str]:
        hosts = self.hosts
        env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.ifname(host), "OMP_NUM_THREADS": "1"}
        argv = [*EAGLEEYE, "agent", "--controller", self.listen, *role, "--no-host-metrics"]
        argv += ["--advertise", hosts.addresses[host], "--heartbeat", "0.5"]
        argv += ["--secret-file", str(self.tmp / "secret")]
        argv += ["--log-dir", str(self.tmp / f"logs-{host}"), str(self.script), str(self.finish)]
        return hosts.popen(host, argv, env=env, stderr=subprocess.DEVNULL, text=True)


def test_a_lost_host_costs_only_its_replica_which_catches_up_on_the_spare(
    tmp_path: Path,
) -> None:
    need_netns()
    with NetHosts(4) as hosts:
        job = ReplicaJob(tmp_path, hosts, 5705, "replicas")
        controller, next_line, first, finish = job.controller, job.next_line, job.first, job.finish
        a, b, spare, seen = job.a, job.b, job.spare, job.seen
        assert first[0]["pid"] in hosts.pids(1)
        assert first[1]["pid"] in hosts.pids(2)
        healthy = tmp_path / "logs-1" / "replica-0-0" / "rank-0.log"
        lost = tmp_path / "logs-2" / "replica-1-0" / "rank-1.log"
        wait_for(lambda: len(steps(lost)) >= 5, "replica 1 never stepped on host B")

        for pid in hosts.pids(2):  # host B is lost: every process of its namespace killed
            os.kill(pid, signal.SIGKILL)
        b.wait(timeout=30)
        finding = next_line(lambda i: i.get("kind") == "host_lost")
        assert finding["subject"]["node"] == "node1"
        assert finding["evidence"]["pings"] >= 1
        at_loss = steps(healthy)[-1]
        moved = next_line(running(1))["detail"]
        assert moved["agent"].endswith("-spare")
        assert moved["pid"] in hosts.pids(3)
        joined = next_line(
            lambda i: i.get("subject") == "replica:1" and "joined_epoch" in i["detail"]
        )
        assert joined["phase"] == "running"
        assert first[0]["pid"] in hosts.pids(1)  # replica 0's rank: the same process
        assert steps(healthy)[-1] > at_loss  # and it trained on while replica 1 caught up
        end_at = steps(healthy)[-1] + 20
        finish.write_text(str(end_at))
        end = next_line(lambda i: i.get("subject") == "job" and i.get("phase") != "running")
        assert end["phase"] == "succeeded", end
        assert controller.wait(timeout=60) == 0
        for proc in (a, spare):
            proc.wait(timeout=60)
            assert proc.returncode == 0  # told to stop, every rank ended
        for host in range(4):
            assert hosts.pids(host) == []  # no process of the job is left on any host
    survived = steps(healthy)
    assert survived == list(range(survived[0], survived[-1] + 1))  # one process, every step
    assert survived[-1] >= end_at
    caught_up = tmp_path / "logs-3" / "replica-1-1" / "rank-1.log"
    assert "caught up" in caught_up.read_text()
    rejoined = steps(caught_up)
    assert rejoined
    assert rejoined[0] > at_loss
    assert rejoined[-1] == survived[-1]
    assert [i["detail"]["pid"] for i in seen if running(0)(i)] == [first[0]["pid"]]
    with RunReader(tmp_path / "runs" / "replicas") as run:
        findings, actions = answered(run)
    assert list(zip(findings["kind"], findings["node"], strict=True)) == [("host_lost", "node1")]
    assert list(zip(actions["kind"], actions["status"], strict=True)) == [("evict", "done")]
    assert "replicas [1] restarted there, catching up from replica 0" in actions["detail"][0]


def test_a_cut_link_fences_the_host_and_only_its_replica_moves_to_the_spare(
    tmp_path: Path,
) -> None:
    """Host B's link cut: `host_lost`, replica 1 restarts on the spare and catches up;
    when the link comes back, B's agent ends its old rank and joins again as a spare,
    and replica 0's rank has kept its pid and every step."""
    need_netns()
    with NetHosts(4) as hosts:
        job = ReplicaJob(tmp_path, hosts, 5706, "cut")
        controller, next_line, first, finish = job.controller, job.next_line, job.first, job.finish
        a, b, spare, seen = job.a, job.b, job.spare, job.seen
        healthy = tmp_path / "logs-1" / "replica-0-0" / "rank-0.log"
        cut = tmp_path / "logs-2" / "replica-1-0" / "rank-1.log"
        wait_for(lambda: len(steps(cut)) >= 5, "replica 1 never stepped on host B")

        hosts.cut(2)  # host B's cable pulled
        finding = next_line(lambda i: i.get("kind") == "host_lost")
        assert finding["subject"]["node"] == "node1"
        at_loss = steps(healthy)[-1]
        moved = next_line(running(1))["detail"]
        assert moved["agent"].endswith("-spare")
        next_line(lambda i: i.get("subject") == "replica:1" and "joined_epoch" in i["detail"])
        assert steps(healthy)[-1] > at_loss

        hosts.restore(2)  # B comes back: fenced, its old rank ended, a spare again
        rejoined = next_line(
            lambda i: i.get("phase") == "running" and i["detail"].get("rejoined_from")
        )
        assert rejoined["detail"]["rejoined_from"] == first[1]["agent"]
        wait_for(lambda: hosts.pids(2) == [b.pid], "host B's old rank was not ended")
        assert first[0]["pid"] in hosts.pids(1)  # replica 0's rank: the same process
        end_at = steps(healthy)[-1] + 20
        finish.write_text(str(end_at))
        end = next_line(lambda i: i.get("subject") == "job" and i.get("phase") != "running")
        assert end["phase"] == "succeeded", end
        assert controller.wait(timeout=60) == 0
        for proc in (a, b, spare):
            proc.wait(timeout=60)
            assert proc.returncode == 0
        for host in range(4):
            assert hosts.pids(host) == []
    survived = steps(healthy)
    assert survived == list(range(survived[0], survived[-1] + 1))
    assert survived[-1] >= end_at
    assert steps(tmp_path / "logs-3" / "replica-1-1" / "rank-1.log")[-1] == survived[-1]
    assert not (tmp_path / "logs-2" / "replica-1-1").exists()  # never given a rank again
    assert [i["detail"]["pid"] for i in seen if running(0)(i)] == [first[0]["pid"]]
