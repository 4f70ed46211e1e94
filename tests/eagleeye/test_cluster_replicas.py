"""Replicas across hosts through the real commands on loopback: `eagleeye controller
--recovery replica --replicas 2`, agents for node ranks 0 and 1 (one replica each) and a
spare. Node rank 1's host is lost (its agent and its rank killed): a `host_lost` finding,
only replica 1 restarts, on the spare, and catches up from replica 0, whose rank keeps its
pid and keeps stepping; the job succeeds and no rank outlives it."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eagleeye.store import RunReader
from ft_runtime.ports import free_port
from tests.eagleeye.cluster_replica_helpers import SCRIPT, steps

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
EAGLEEYE = [sys.executable, "-m", "eagleeye"]


class Lines:
    """The controller's JSON lines, read on a thread so that its pipe never fills."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[dict[str, Any]] = []
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)

    def next(self, want: Callable[[dict[str, Any]], bool], limit: float = 150.0) -> dict[str, Any]:
        deadline = time.monotonic() + limit
        while True:
            item = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert item is not None, "the controller ended early"
            self.seen.append(item)
            if want(item):
                return item


def running(rank: int) -> Callable[[dict[str, Any]], bool]:
    """A rank's process started by an agent (its pid and agent)."""
    return lambda i: (
        i.get("subject") == f"rank:{rank}" and i.get("phase") == "running" and "pid" in i["detail"]
    )


def wait_for(check: Callable[[], bool], what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_lost_host_restarts_only_its_replica_on_the_spare(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    finish = tmp_path / "finish"
    listen = f"127.0.0.1:{free_port()}"
    common = ["--secret-file", str(tmp_path / "secret"), "--heartbeat", "0.3"]
    controller = subprocess.Popen(
        [*EAGLEEYE, "controller", "--listen", listen, "--nnodes", "2", "--remediate", *common]
        + ["--recovery", "replica", "--replicas", "2"]
        + ["--runs-dir", str(tmp_path / "runs"), "--run-id", "r"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines = Lines(controller)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def agent(role: list[str], name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*EAGLEEYE, "agent", "--controller", listen, *role, *common, "--no-host-metrics"]
            + ["--advertise", "127.0.0.1", "--log-dir", str(tmp_path / name)]
            + [str(script), str(finish)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    agents: list[subprocess.Popen[str]] = []
    try:
        lines.next(lambda i: "listening" in i)
        agents.append(agent(["--spare"], "spare"))
        lines.next(lambda i: i.get("phase") == "running" and i["detail"].get("spare"))
        agents += [agent(["--node-rank", "0"], "logs0"), agent(["--node-rank", "1"], "logs1")]
        first: dict[int, dict[str, Any]] = {}
        while len(first) < 2:  # each rank's process started by its agent, in any order
            item = lines.next(lambda i: running(0)(i) or running(1)(i))
            first[int(item["subject"].removeprefix("rank:"))] = item["detail"]
        healthy = tmp_path / "logs0" / "replica-0-0" / "rank-0.log"
        wait_for(lambda: len(steps(healthy)) >= 10, "replica 0 never stepped")

        os.kill(agents[2].pid, signal.SIGKILL)  # node rank 1's host is lost
        os.kill(first[1]["pid"], signal.SIGKILL)
        finding = lines.next(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["node"]) == ("host_lost", "node1")
        at_loss = steps(healthy)[-1]
        moved = lines.next(running(1))["detail"]
        assert moved["agent"].endswith("-spare")
        joined = lines.next(
            lambda i: i.get("subject") == "replica:1" and "joined_epoch" in i["detail"]
        )
        assert joined["phase"] == "running"
        assert steps(healthy)[-1] > at_loss  # replica 0 trained on while 1 caught up
        end_at = steps(healthy)[-1] + 20
        finish.write_text(str(end_at))
        end = lines.next(lambda i: i.get("subject") == "job" and i.get("phase") != "running")
        assert end["phase"] == "succeeded", end
        assert controller.wait(timeout=60) == 0
        for proc in agents[:2]:
            proc.communicate(timeout=60)
            assert proc.returncode == 0
    finally:
        for proc in [controller, *agents]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
    survived = steps(healthy)
    assert survived == list(range(survived[0], survived[-1] + 1))  # never restarted
    assert survived[-1] >= end_at
    rejoined = steps(tmp_path / "spare" / "replica-1-1" / "rank-1.log")
    assert rejoined
    assert rejoined[0] > at_loss
    assert rejoined[-1] == survived[-1]
    started = [i["detail"]["pid"] for i in lines.seen if running(0)(i)]
    assert started == [first[0]["pid"]]  # rank 0 never started again: its pid is the first
    with RunReader(tmp_path / "runs" / "r") as run:
        findings = run.findings()
        actions = run.actions()
    assert list(findings["kind"]) == ["host_lost"]
    assert list(zip(actions["kind"], actions["status"], strict=True)) == [("evict", "done")]
    assert "replicas [1] restarted there, catching up from replica 0" in actions["detail"][0]
    for pid in (first[0]["pid"], first[1]["pid"], moved["pid"]):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().split()[2] == "Z", f"rank process {pid} outlived the run"
