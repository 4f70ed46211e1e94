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
import sqlite3
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
from tests.eagleeye.cluster_replica_helpers import SCRIPT, answered, steps
from tests.eagleeye.procs import outliving

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


def end_store(run: Path) -> None:
    """Kills the quorum's store process of ``run`` if a failed test left it (a controller
    killed outright leaves it to end on its own lease, minutes later)."""
    try:
        conn = sqlite3.connect(f"file:{run / 'run.db'}?mode=ro", uri=True, timeout=30)
        try:
            found = conn.execute("SELECT value FROM meta WHERE key = 'replica_state'").fetchall()
        finally:
            conn.close()
        pid = int(json.loads(found[0][0])["store"]["pid"]) if found else 0
        if pid and b"ft_runtime.storehost" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except (OSError, sqlite3.Error):
        pass  # no run store yet, or no such process: nothing left


class Job:
    """The controller and its agents (node ranks 0 and 1, and a spare) on loopback; each
    agent's stderr in ``{name}.err``. ``controller``: its flags beyond the job's;
    ``script``: the ranks' script;
    ``agent_env``: an agent's environment beyond the test's, by its name (a fault its
    ranks inject)."""

    def __init__(
        self,
        tmp_path: Path,
        controller: tuple[str, ...] = ("--remediate",),
        script: str = SCRIPT,
    ) -> None:
        (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
        self.tmp = tmp_path
        self.script = tmp_path / "train.py"
        self.script.write_text(script)
        self.finish = tmp_path / "finish"
        self.listen = f"127.0.0.1:{free_port()}"
        self.common = ["--secret-file", str(tmp_path / "secret"), "--heartbeat", "0.3"]
        self.argv = (
            [*EAGLEEYE, "controller", "--listen", self.listen, "--nnodes", "2", *controller]
            + [*self.common, "--recovery", "replica", "--replicas", "2"]
            + ["--runs-dir", str(tmp_path / "runs"), "--run-id", "r"]
        )
        self.controller = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.lines = Lines(self.controller)
        self.agents: list[subprocess.Popen[str]] = []
        self.agent_env: dict[str, dict[str, str]] = {}
        self.sources = ["--no-host-metrics"]  # an agent's host sources: none by default
        self.first: dict[int, dict[str, Any]] = {}
        self.healthy = tmp_path / "logs0" / "replica-0-0" / "rank-0.log"

    def agent(self, role: list[str], name: str) -> subprocess.Popen[str]:
        with (self.tmp / f"{name}.err").open("w") as err:
            proc = subprocess.Popen(
                [*EAGLEEYE, "agent", "--controller", self.listen, *role, *self.common]
                + [*self.sources, "--advertise", "127.0.0.1"]
                + ["--log-dir", str(self.tmp / name), str(self.script), str(self.finish)],
                stderr=err,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1", **self.agent_env.get(name, {})},
            )
        self.agents.append(proc)
        return proc

    def start(self, spare: bool = True, host_b: tuple[str, ...] = ()) -> None:
        """Every agent joined, each rank started, replica 0 stepping. ``host_b``: the
        flags of node rank 1's agent beyond its node rank."""
        self.lines.next(lambda i: "listening" in i)
        if spare:
            self.agent(["--spare"], "spare")
            self.lines.next(lambda i: i.get("phase") == "running" and i["detail"].get("spare"))
        self.agent(["--node-rank", "0"], "logs0")
        self.agent(["--node-rank", "1", *host_b], "logs1")
        while len(self.first) < 2:  # each rank's process started by its agent, in any order
            item = self.lines.next(lambda i: running(0)(i) or running(1)(i))
            self.first[int(item["subject"].removeprefix("rank:"))] = item["detail"]
        wait_for(lambda: len(steps(self.healthy)) >= 10, "replica 0 never stepped")

    def caught_up(self, at_loss: int) -> dict[str, Any]:
        """Replica 1 restarted and admitted while replica 0 trained on; then every replica
        is told to stop 20 steps on, and the job succeeds. Returns the restarted rank's
        process (its agent and pid)."""
        moved = self.rejoined(at_loss)
        self.finished()
        return moved

    def rejoined(self, at_loss: int) -> dict[str, Any]:
        """Replica 1 restarted and admitted while replica 0 trained on. Returns the
        restarted rank's process (its agent and pid)."""
        moved = self.lines.next(running(1))["detail"]
        joined = self.lines.next(
            lambda i: i.get("subject") == "replica:1" and "joined_epoch" in i["detail"]
        )
        assert joined["phase"] == "running"
        assert steps(self.healthy)[-1] > at_loss  # replica 0 trained on while 1 caught up
        return dict(moved)

    def finished(self) -> None:
        """Every replica told to stop 20 steps on: the job succeeds."""
        self.end_at = steps(self.healthy)[-1] + 20
        self.finish.write_text(str(self.end_at))
        end = self.lines.next(lambda i: i.get("subject") == "job" and i.get("phase") != "running")
        assert end["phase"] == "succeeded", end
        assert self.controller.wait(timeout=60) == 0

    def close(self) -> None:
        for proc in [self.controller, *self.agents]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        end_store(self.tmp / "runs" / "r")

    def check_healthy(self, rejoined_log: Path, at_loss: int) -> None:
        """Replica 0's rank: one process that committed every step; replica 1's new one
        started after the loss and ended at the same step."""
        survived = steps(self.healthy)
        assert survived == list(range(survived[0], survived[-1] + 1))  # never restarted
        assert survived[-1] >= self.end_at
        rejoined = steps(rejoined_log)
        assert rejoined
        assert rejoined[0] > at_loss
        assert rejoined[-1] == survived[-1]
        assert "caught up" in rejoined_log.read_text()
        started = [i["detail"]["pid"] for i in self.lines.seen if running(0)(i)]
        assert started == [self.first[0]["pid"]]  # rank 0 never started again

    def went_on_alone(self, at_loss: int) -> None:
        """With no spare, replica 0 trained on after node rank 1's host went; told to stop
        10 steps on, the job succeeds without replica 1."""
        wait_for(lambda: steps(self.healthy)[-1] > at_loss + 5, "replica 0 stopped stepping")
        self.end_at = steps(self.healthy)[-1] + 10
        self.finish.write_text(str(self.end_at))
        end = self.lines.next(lambda i: i.get("subject") == "job" and i.get("phase") != "running")
        assert end["phase"] == "succeeded", end
        assert end["detail"]["lost"] == [1]
        assert self.controller.wait(timeout=60) == 0

    def alone(self, kinds: list[str]) -> None:
        """After ``went_on_alone``: replica 0's rank committed every step to the end,
        rank 1 never started again, the store's findings are ``kinds`` (hangs aside) and
        their one action an ``evict``, done, with no spare; no rank is left."""
        survived = steps(self.healthy)
        assert survived == list(range(survived[0], survived[-1] + 1))
        assert survived[-1] >= self.end_at
        started = [i["detail"]["pid"] for i in self.lines.seen if running(1)(i)]
        assert started == [self.first[1]["pid"]]  # rank 1 never started again
        with RunReader(self.tmp / "runs" / "r") as run:
            findings, actions = answered(run)
        assert list(findings["kind"]) == kinds
        assert list(zip(actions["kind"], actions["status"], strict=True)) == [("evict", "done")]
        assert actions["detail"][0].startswith("no spare host")
        self.no_rank_left(self.first[0]["pid"], self.first[1]["pid"])

    def moved_to_spare(self, at_loss: int, moved: dict[str, Any], kinds: list[str]) -> str:
        """After the job: replica 1 ran on from the spare (``check_healthy``), the store's
        findings are ``kinds`` (hangs aside) and their one action an ``evict``, done, its
        replica caught up from replica 0; no rank is left. Returns the action's detail."""
        self.check_healthy(self.tmp / "spare" / "replica-1-1" / "rank-1.log", at_loss)
        with RunReader(self.tmp / "runs" / "r") as run:
            findings, actions = answered(run)
        assert list(findings["kind"]) == kinds
        assert list(zip(actions["kind"], actions["status"], strict=True)) == [("evict", "done")]
        detail = str(actions["detail"][0])
        assert "replicas [1] restarted there, catching up from replica 0" in detail
        self.no_rank_left(self.first[0]["pid"], self.first[1]["pid"], moved["pid"])
        return detail

    def no_rank_left(self, *pids: int) -> None:
        assert outliving(pids) == [], "rank processes outlived the run"


def test_a_lost_host_restarts_only_its_replica_on_the_spare(tmp_path: Path) -> None:
    job = Job(tmp_path)
    try:
        job.start()
        os.kill(job.agents[2].pid, signal.SIGKILL)  # node rank 1's host is lost
        os.kill(job.first[1]["pid"], signal.SIGKILL)
        finding = job.lines.next(lambda i: i.get("kind") == "host_lost")
        assert finding["subject"]["node"] == "node1"
        at_loss = steps(job.healthy)[-1]
        moved = job.caught_up(at_loss)
        assert moved["agent"].endswith("-spare")
        for proc in job.agents[:2]:
            proc.wait(timeout=60)
            assert proc.returncode == 0
    finally:
        job.close()
    job.moved_to_spare(at_loss, moved, ["host_lost"])


def test_a_failed_rank_restarts_only_its_replica_on_the_same_host(tmp_path: Path) -> None:
    job = Job(tmp_path)
    try:
        job.start()
        os.kill(job.first[1]["pid"], signal.SIGKILL)  # rank 1 dies; its host is fine
        finding = job.lines.next(lambda i: i.get("kind") == "process_exit")
        assert finding["subject"]["rank"] == 1
        at_loss = steps(job.healthy)[-1]
        again = job.caught_up(at_loss)
        assert again["agent"] == job.first[1]["agent"]  # the same agent started it again
        assert again["pid"] != job.first[1]["pid"]
        for proc in job.agents:
            proc.wait(timeout=60)
            assert proc.returncode == 0
    finally:
        job.close()
    job.check_healthy(tmp_path / "logs1" / "replica-1-1" / "rank-1.log", at_loss)
    with RunReader(tmp_path / "runs" / "r") as run:
        findings, actions = answered(run)
    assert list(findings["kind"]) == ["process_exit"]
    assert list(zip(actions["kind"], actions["target"], strict=True)) == [("restart", "replica:1")]
    assert list(actions["status"]) == ["done"]
    job.no_rank_left(job.first[0]["pid"], job.first[1]["pid"], again["pid"])


def test_sigterm_to_the_controller_ends_every_replica_and_records_the_stop(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    try:
        job.start()
        job.controller.send_signal(signal.SIGTERM)
        end = job.lines.next(lambda i: i.get("subject") == "job" and i.get("phase") != "running")
        assert end["phase"] == "failed"
        assert end["detail"]["reason"] == "stopped by SIGTERM"
        assert job.controller.wait(timeout=60) == 1
        for proc in job.agents:
            proc.wait(timeout=60)
            assert proc.returncode == 0  # told to stop, its ranks ended
    finally:
        job.close()
    job.no_rank_left(job.first[0]["pid"], job.first[1]["pid"])
    with RunReader(tmp_path / "runs" / "r") as run:
        events = run.events()
    stops = [dict(e["detail"]) for _, e in events.iterrows() if e["subject"] == "job"]
    assert {"reason": "stopped by SIGTERM", "stopped": True} in stops


def test_with_no_spare_the_other_replica_goes_on_alone(tmp_path: Path) -> None:
    job = Job(tmp_path)
    try:
        job.start(spare=False)
        os.kill(job.agents[1].pid, signal.SIGKILL)  # node rank 1's host is lost
        os.kill(job.first[1]["pid"], signal.SIGKILL)
        finding = job.lines.next(lambda i: i.get("kind") == "host_lost")
        assert finding["subject"]["node"] == "node1"
        job.went_on_alone(steps(job.healthy)[-1])
        job.agents[0].wait(timeout=60)
        assert job.agents[0].returncode == 0
    finally:
        job.close()
    job.alone(["host_lost"])


def test_a_stopped_rank_is_found_hung_and_only_its_replica_restarts(tmp_path: Path) -> None:
    job = Job(tmp_path)
    try:
        job.start()
        os.kill(job.first[1]["pid"], signal.SIGSTOP)  # rank 1 stands still; its host is fine
        hang = job.lines.next(lambda i: i.get("type") == "Finding")
        assert (hang["kind"], hang["subject"]["replica"]) == ("hang", 1)
        assert hang["evidence"]["stopped_rank_1"] == 1.0  # its agent saw it stopped
        failed = job.lines.next(lambda i: i.get("type") == "Finding")
        assert (failed["kind"], failed["subject"]["rank"]) == ("process_exit", 1)
        at_loss = steps(job.healthy)[-1]
        again = job.caught_up(at_loss)
        assert again["agent"] == job.first[1]["agent"]
    finally:
        job.close()
    job.check_healthy(tmp_path / "logs1" / "replica-1-1" / "rank-1.log", at_loss)
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.actions()
    assert list(zip(actions["kind"], actions["finding_kind"], strict=True)) == [
        ("isolate", "hang"),
        ("restart", "process_exit"),
    ]
    job.no_rank_left(job.first[0]["pid"], job.first[1]["pid"], again["pid"])


def test_a_wipe_out_after_a_lost_host_with_no_spare_ends_the_job_cleanly(
    tmp_path: Path,
) -> None:
    # replica 1's host is lost (no spare), then replica 0's rank dies: no healthy replica
    # is left and nowhere to place node rank 1's ranks; the job fails, saying why, and
    # the controller ends without a traceback, leaving no rank
    job = Job(tmp_path)
    try:
        job.start(spare=False)
        os.kill(job.agents[1].pid, signal.SIGKILL)
        os.kill(job.first[1]["pid"], signal.SIGKILL)
        job.lines.next(lambda i: i.get("kind") == "host_lost")
        os.kill(job.first[0]["pid"], signal.SIGKILL)
        end = job.lines.next(lambda i: i.get("subject") == "job" and i.get("phase") == "failed")
        assert end["detail"]["reason"], end
        assert job.controller.wait(timeout=60) == 1
        assert job.agents[0].wait(timeout=60) == 0
    finally:
        job.close()
    started = [i["detail"]["pid"] for i in job.lines.seen if running(0)(i)]
    job.no_rank_left(*started)
