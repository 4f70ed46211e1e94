"""`eagleeye controller` and `eagleeye agent` on one machine (loopback), with plain Python
ranks: a failing rank restarts the job on both agents as the next attempt, with
torchrun's environment; SIGTERM to the controller stops every agent's ranks and records
why; SIGTERM to an agent ends its ranks and tells the controller, which records why and
stops the job; an agent gone silent (SIGSTOP) is a lost host, found after pings, and the
job stops. No rank outlives the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from ft_runtime.ports import free_port
from tests.eagleeye.procs import outliving

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(200)]

RANK = """
import os, sys, time
env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
       "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")}
print(env, flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(3 if env["RANK"] == "1" and env["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
"""
EAGLEEYE = [sys.executable, "-m", "eagleeye"]


class Cluster:
    def __init__(
        self,
        tmp: Path,
        seconds: str,
        extra: tuple[str, ...] = (),
        nproc: int = 1,
        script: str = RANK,
        controller: tuple[str, ...] = (),
        agent_errors: bool = False,
        nnodes: int = 2,
        program: tuple[str, ...] = (),
    ) -> None:
        """``program``: what each agent runs (a script and its arguments, or ``-m`` and a
        module's); by default ``script`` written to rank.py, given ``seconds``."""
        (tmp / "secret").write_text("0123456789abcdef0123456789abcdef\n")
        (tmp / "rank.py").write_text(script)
        self.tmp = tmp
        self.listen = f"127.0.0.1:{free_port()}"
        common = ["--secret-file", str(tmp / "secret"), "--heartbeat", "0.2"]
        # its log goes to a file: a pipe nobody reads would block it once 64 KiB are said
        self.controller_log = (tmp / "controller.err").open("w")
        self.controller = subprocess.Popen(
            [*EAGLEEYE, "controller", "--listen", self.listen, "--nnodes", str(nnodes), *common]
            + ["--nproc-per-node", str(nproc), *controller]
            + ["--runs-dir", str(tmp / "runs"), "--run-id", "r"],
            stdout=subprocess.PIPE,
            stderr=self.controller_log,
            text=True,
        )
        self.read(lambda i: "listening" in i)
        # with agent_errors, each agent's stderr goes to agent-N.err (what it says at its end)
        self.errors = [(tmp / f"agent-{n}.err").open("w") for n in range(nnodes) if agent_errors]
        program = program or (str(tmp / "rank.py"), seconds)
        self.agents = [
            subprocess.Popen(
                [*EAGLEEYE, "agent", "--controller", self.listen, "--node-rank", str(n), *common]
                + ["--no-host-metrics", *(extra if n == 1 else ())]
                + ["--log-dir", str(tmp / f"logs{n}"), *program],
                stderr=self.errors[n] if agent_errors else subprocess.DEVNULL,
            )
            for n in range(nnodes)
        ]
        self.pids: list[int] = []
        self.by_rank: dict[tuple[int, int], int] = {}  # (attempt, rank) → its process

    def read(self, want) -> dict:
        assert self.controller.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.controller.stdout.readline()
            assert line, f"the controller ended early: {self.said()}"
            item = json.loads(line)
            if str(item.get("subject")).startswith("rank:") and item.get("phase") == "launch":
                detail = item["detail"]
                self.pids.append(int(detail["pid"]))
                self.by_rank[(int(detail["attempt"]), int(detail["rank"]))] = int(detail["pid"])
            if want(item):
                return dict(item)
        raise AssertionError(f"not seen in time; the controller said: {self.said()}")

    def said(self) -> str:
        """The end of the controller's log."""
        self.controller_log.flush()
        return (self.tmp / "controller.err").read_text(errors="replace")[-3000:]

    def launched(self, ranks: set[int], attempt: int) -> None:
        """Reads until every rank of ``ranks`` was launched as ``attempt``, in any order."""
        seen: set[int] = set()
        while seen != ranks:
            item = self.read(
                lambda i: (
                    str(i.get("subject")).startswith("rank:")
                    and i.get("phase") == "launch"
                    and i["detail"]["attempt"] == attempt
                )
            )
            seen.add(int(item["detail"]["rank"]))

    def findings_to_the_end(self) -> tuple[dict, list[dict]]:
        """Reads to the job's end; its end and every finding said before it."""
        findings: list[dict] = []
        end = self.read(
            lambda i: (
                findings.append(i) if i.get("type") == "Finding" else None,
                i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed"),
            )[1]
        )
        return end, findings

    def ended(self) -> dict:
        return self.read(
            lambda i: i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed")
        )

    def no_rank_left(self) -> None:
        assert outliving(self.pids) == [], "rank processes outlived the run"

    def close(self) -> None:
        for proc in [self.controller, *self.agents]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        for errors in [*self.errors, self.controller_log]:
            errors.close()


def test_a_failed_rank_restarts_the_job_on_every_agent(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "0.5", controller=("--remediate",))
    try:
        finding = cluster.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("process_exit", 1)
        assert cluster.ended()["phase"] == "succeeded"
        assert cluster.controller.wait(timeout=30) == 0
        assert [a.wait(timeout=30) for a in cluster.agents] == [0, 0]
    finally:
        cluster.close()
    second = (tmp_path / "logs1" / "attempt-1" / "rank-1.log").read_text()
    assert "'TORCHELASTIC_RESTART_COUNT': '1'" in second
    assert "'GROUP_RANK': '1'" in second
    assert "'WORLD_SIZE': '2'" in second
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.actions()
        result = run.meta()["result"]
    assert list(zip(actions["kind"], actions["finding_kind"], strict=True)) == [
        ("restart", "process_exit")
    ]
    assert (result["succeeded"], result["attempts"]) == (True, 2)
    assert result["ended"] > result["started"]
    cluster.no_rank_left()


def test_sigterm_to_the_controller_stops_every_rank(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "60")
    try:
        cluster.launched({0, 1}, 0)
        os.kill(cluster.pids[0], signal.SIGSTOP)  # a stopped rank: continued, then ended
        cluster.controller.send_signal(signal.SIGTERM)
        end = cluster.ended()
        assert end["phase"] == "failed"
        assert end["detail"]["reason"] == "stopped by SIGTERM"
        assert cluster.controller.wait(timeout=30) == 1
        assert [a.wait(timeout=30) for a in cluster.agents] == [0, 0]
    finally:
        cluster.close()
    cluster.no_rank_left()


def test_sigterm_to_an_agent_ends_its_ranks_and_the_stop_is_recorded(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "60")
    try:
        cluster.launched({0, 1}, 0)
        cluster.agents[1].send_signal(signal.SIGTERM)  # its ranks end with it
        end = cluster.ended()
        assert end["phase"] == "failed"
        assert end["detail"]["reason"].startswith("stopped by SIGTERM to the agent")
        assert cluster.agents[1].wait(timeout=30) == 1  # it left on the signal
        assert cluster.agents[0].wait(timeout=30) == 0  # told to stop its ranks
    finally:
        cluster.close()
    with RunReader(tmp_path / "runs" / "r") as run:
        left = run.query("SELECT detail FROM events WHERE subject LIKE 'agent:%-1'")
    assert any("SIGTERM to the agent" in detail for detail in left["detail"])
    cluster.no_rank_left()


def test_an_agent_gone_silent_is_a_lost_host_and_the_job_stops(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "60")
    try:
        cluster.launched({0, 1}, 0)
        cluster.agents[1].send_signal(signal.SIGSTOP)  # silent: no heartbeat, no pong
        finding = cluster.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["node"]) == ("host_lost", "node1")
        assert finding["evidence"]["pings"] >= 1
        assert cluster.ended()["phase"] == "failed"
        assert cluster.agents[0].wait(timeout=30) == 0  # told to stop its ranks
        cluster.agents[1].send_signal(signal.SIGCONT)
        cluster.agents[1].send_signal(signal.SIGTERM)  # the lost agent ends its ranks
        # whichever comes first ends it: the signal (1), or the fence the controller left
        # on its link while it was stopped (0, "fenced by the controller")
        assert cluster.agents[1].wait(timeout=30) in (0, 1)
    finally:
        cluster.close()
    cluster.no_rank_left()


def test_an_agents_kernel_log_xid_evicts_its_host(tmp_path: Path) -> None:
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, before the job\n")
    extra = ("--kernel-log", str(kernel_log), "--sources-period", "0.2")
    cluster = Cluster(tmp_path, "60", extra, controller=("--remediate",))
    try:
        cluster.launched({0, 1}, 0)  # the agents read their sources from the launch on
        with kernel_log.open("a") as f:
            f.write("[ 99.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus\n")
        finding = cluster.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["node"]) == ("xid", "node1")
        assert (finding["severity"], finding["evidence"]["xid"]) == ("critical", 79.0)
        end = cluster.ended()  # the host is evicted; with no spare, the job stops
        assert end["phase"] == "failed"
        assert "evicted: xid" in end["detail"]["reason"]
        assert [a.wait(timeout=30) for a in cluster.agents] == [0, 0]
    finally:
        cluster.close()
    with RunReader(tmp_path / "runs" / "r") as run:
        xids = run.query("SELECT node, value FROM samples WHERE name = 'gpu_xid'")
        actions = run.actions()
    assert list(zip(xids["node"], xids["value"], strict=True)) == [("node1", 79.0)]
    assert list(zip(actions["kind"], actions["finding_kind"], strict=True)) == [("evict", "xid")]
    cluster.no_rank_left()


def test_a_killed_agent_leaves_no_rank_not_even_a_stopped_one(tmp_path: Path) -> None:
    # an agent that dies (OOM-killed, SIGKILLed) supervises nothing any more: its ranks
    # end with it, a stopped one too, instead of holding the host's GPUs unsupervised
    cluster = Cluster(tmp_path, "120")
    try:
        cluster.launched({0, 1}, 0)
        rank1 = cluster.by_rank[(0, 1)]
        os.kill(rank1, signal.SIGSTOP)
        cluster.agents[1].kill()
        cluster.agents[1].wait(timeout=10)
        deadline = time.monotonic() + 20
        while _alive(rank1):
            assert time.monotonic() < deadline, "the killed agent's rank lives on"
            time.sleep(0.05)
        assert _alive(cluster.by_rank[(0, 0)])  # the other host's rank is not its agent's
    finally:
        cluster.close()
    cluster.no_rank_left()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
