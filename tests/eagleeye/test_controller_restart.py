"""`eagleeye controller` killed (SIGKILL) mid-run and started again with the same command
line (loopback, two `eagleeye agent` processes, ranks that step through the in-loop
hook): it reopens the run store and adopts the agents' running ranks, which trained on
meanwhile and are never relaunched (the same pids); the steps go on, the job succeeds,
and every record from before the kill is still in the store. Ranks that ended while the
controller was away are answered when it comes back. Strangers (a wrong secret, an agent
the run never admitted) are refused by the restarted controller. No process is left."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from ft_runtime.ports import free_port
from tests.eagleeye.procs import ended, outliving

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

EAGLEEYE = [sys.executable, "-m", "eagleeye"]
SECRET = "0123456789abcdef0123456789abcdef\n"
#: Ranks that step through the hook; rank 1's loss is NaN at step 3 (a finding, and a
#: restart decided as a dry run, before the controller is killed).
STEPS = """
import math, sys, time
import eagleeye
ee = eagleeye.init()
for step in range(int(sys.argv[1])):
    ee.step_start(step)
    time.sleep(float(sys.argv[2]))
    loss = math.nan if ee.rank == 1 and step == 3 else 1.0 / (step + 1)
    ee.step_end(step, loss=loss)
ee.close()
"""
TABLES = ("findings", "actions", "events", "samples")


class Job:
    """A controller and two agents on loopback, the controller restartable."""

    def __init__(
        self,
        tmp: Path,
        steps: int,
        step_s: float,
        *agent_flags: object,
        script: str = STEPS,
        controller: tuple[str, ...] = (),
    ) -> None:
        (tmp / "secret").write_text(SECRET)
        (tmp / "rank.py").write_text(script)
        self.flags = controller
        self.tmp = tmp
        self.listen = f"127.0.0.1:{free_port()}"
        self.common = ["--secret-file", str(tmp / "secret"), "--heartbeat", "0.25"]
        self.runs = tmp / "runs"
        self.starts = 0
        self.pids: dict[int, int] = {}
        self.controller, self.out = self.start_controller()
        self.agents = [
            self.agent(str(n), *agent_flags, "--log-dir", tmp / f"logs{n}", steps, step_s)
            for n in range(2)
        ]

    def start_controller(self) -> tuple[subprocess.Popen[str], IO[str]]:
        """The controller, always with the same command line."""
        self.starts += 1
        err = (self.tmp / f"controller-{self.starts}.err").open("w")
        proc = subprocess.Popen(
            [*EAGLEEYE, "controller", "--listen", self.listen, "--nnodes", "2", *self.common]
            + ["--runs-dir", str(self.runs), "--run-id", "r", *self.flags],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proc.stdout is not None
        self.controller, self.out = proc, proc.stdout
        self.read(lambda i: "listening" in i)
        return proc, proc.stdout

    def agent(self, node: str, *extra: object, secret: str | None = None) -> subprocess.Popen:
        common = list(self.common)
        if secret is not None:
            common[1] = secret
        args = [str(a) for a in extra]
        flags, script = args[:-2], args[-2:]
        return subprocess.Popen(
            [*EAGLEEYE, "agent", "--controller", self.listen, "--node-rank", node, *common]
            + ["--no-host-metrics", *flags, str(self.tmp / "rank.py"), *script],
            stderr=(self.tmp / f"agent-{node}-{len(args)}-{time.monotonic_ns()}.err").open("w"),
        )

    def read(self, want) -> dict:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = self.out.readline()
            assert line, "the controller ended early"
            item = json.loads(line)
            if str(item.get("subject")).startswith("rank:") and item.get("phase") == "launch":
                self.pids[int(item["detail"]["rank"])] = int(item["detail"]["pid"])
            if want(item):
                return dict(item)
        raise AssertionError("not seen in time")

    def ended(self) -> dict:
        return self.read(
            lambda i: i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed")
        )

    def launched(self) -> None:
        while len(self.pids) < 2:
            self.read(lambda i: str(i.get("subject")).startswith("rank:"))

    def rows(self, sql: str) -> list[tuple]:
        conn = sqlite3.connect(self.runs / "r" / "run.db", timeout=30)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def newest_step(self) -> int:
        (step,) = self.rows("SELECT coalesce(max(step), -1) FROM samples")[0]
        return int(step)

    def snapshot(self) -> dict[str, list[tuple]]:
        """Every row of the tables that matter, as committed now."""
        return {t: self.rows(f"SELECT * FROM {t}") for t in TABLES}

    def kill_controller(self) -> None:
        self.controller.send_signal(signal.SIGKILL)
        self.controller.wait(timeout=30)

    def close(self) -> None:
        for proc in [self.controller, *self.agents]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)

    def no_rank_left(self) -> None:
        assert outliving(self.pids.values()) == [], "rank processes outlived the run"


def alive(pid: int) -> bool:
    return not ended(pid)  # one look: its agent may reap it at any time


def until(what, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)


def test_a_restarted_controller_adopts_the_running_ranks_and_loses_nothing(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, steps=160, step_s=0.1)
    try:
        job.launched()
        finding = job.read(lambda i: i.get("type") == "Finding")
        assert finding["kind"] == "nan"
        until(lambda: job.newest_step() >= 20 and job.rows("SELECT count(*) FROM actions")[0][0])
        before = job.snapshot()
        step_before = job.newest_step()
        pids = dict(job.pids)
        job.kill_controller()
        time.sleep(1.0)  # the ranks train on without a controller
        assert all(alive(pid) for pid in pids.values())
        job.start_controller()  # the same command line
        adopted = [job.read(lambda i: bool(i.get("detail", {}).get("adopted"))) for _ in range(2)]
        assert {int(p) for a in adopted for p in a["detail"]["pids"].values()} == set(pids.values())
        until(lambda: job.newest_step() > step_before + 10)
        assert job.ended()["phase"] == "succeeded"
        assert job.controller.wait(timeout=60) == 0
        assert [a.wait(timeout=60) for a in job.agents] == [0, 0]
    finally:
        job.close()
    assert job.pids == pids  # nothing relaunched
    after = job.snapshot()
    for table in TABLES:
        assert set(before[table]) <= set(after[table]), f"rows of {table} lost"
    assert len(after["findings"]) >= 1
    assert {f[3] for f in after["findings"]} == {"nan"}  # no host found lost by the restart
    assert len(after["actions"]) >= 1
    assert job.newest_step() == 159
    launches = job.rows("SELECT count(*) FROM events WHERE subject = 'job' AND phase = 'launch'")
    assert launches == [(1,)]  # one attempt, launched once
    attempts = job.rows("SELECT DISTINCT attempt FROM events")
    assert attempts == [(0,)]
    assert not (tmp_path / "logs0" / "attempt-1").exists()
    job.no_rank_left()


def test_exits_while_the_controller_was_away_are_answered_when_it_comes_back(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, steps=30, step_s=0.1)
    try:
        job.launched()
        job.read(lambda i: i.get("type") == "Finding")
        job.kill_controller()
        until(lambda: not any(alive(pid) for pid in job.pids.values()))  # the job ended
        assert all(a.poll() is None for a in job.agents)  # the agents wait for a controller
        job.start_controller()
        end = job.ended()
        assert (end["phase"], end["detail"]["reason"]) == ("succeeded", "every rank exited 0")
        assert job.controller.wait(timeout=60) == 0
        assert [a.wait(timeout=60) for a in job.agents] == [0, 0]
    finally:
        job.close()
    exits = job.rows("SELECT subject FROM events WHERE phase = 'exited' ORDER BY subject")
    assert exits == [("rank:0",), ("rank:1",)]  # each answered once
    job.no_rank_left()
    again = subprocess.run(  # the same command line once more: the run ended
        [*EAGLEEYE, "controller", "--listen", job.listen, "--nnodes", "2", *job.common]
        + ["--runs-dir", str(job.runs), "--run-id", "r"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 2  # a user's error, said in one line
    assert "run r ended (succeeded); give another --run-id" in again.stderr


def test_the_restarted_controller_refuses_strangers(tmp_path: Path) -> None:
    job = Job(tmp_path, steps=200, step_s=0.1)
    strangers: list[subprocess.Popen] = []
    try:
        job.launched()
        job.kill_controller()
        job.start_controller()
        for _ in range(2):
            job.read(lambda i: bool(i.get("detail", {}).get("adopted")))
        (tmp_path / "wrong").write_text("another secret, 32 bytes long....\n")
        strangers.append(
            job.agent("1", "--log-dir", tmp_path / "x", 1, 0, secret=str(tmp_path / "wrong"))
        )
        strangers.append(
            job.agent("1", "--hostname", "stranger", "--log-dir", tmp_path / "y", 1, 0)
        )
        refused = job.read(lambda i: i.get("subject") == "agent:stranger-1")
        assert "node rank 1 is held by" in refused["detail"]["reason"]
        assert strangers[1].wait(timeout=60) == 2  # told it is refused, ran nothing
        until(lambda: "valid HMAC" in (tmp_path / "controller-2.err").read_text())
        assert strangers[0].poll() is None  # never admitted, never told anything
        assert not (tmp_path / "x").exists()
        assert not (tmp_path / "y").exists()
        assert all(alive(pid) for pid in job.pids.values())  # the job trains on
    finally:
        for proc in strangers:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        job.close()


def test_with_no_controller_coming_back_the_agents_end_once_their_ranks_ended(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, 60, 0.1, "--controller-wait", 1)  # 6 s: alive when looked at
    try:
        job.launched()
        job.kill_controller()
        assert all(alive(pid) for pid in job.pids.values())  # never ended for a silence
        assert [a.wait(timeout=60) for a in job.agents] == [3, 3]  # ranks ended, then they
        for n in range(2):
            log = (tmp_path / f"logs{n}" / "attempt-0" / f"rank-{n}.log").read_text()
            assert "Traceback" not in log  # the ranks trained to their end
        said = "".join(p.read_text() for p in tmp_path.glob("agent-*.err"))
        assert "the controller stayed unreachable" in said
    finally:
        job.close()
    job.no_rank_left()


FAILS_FIRST = """
import os, sys, time
time.sleep(float(sys.argv[2]))
sys.exit(3 if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
"""


def test_a_rank_that_failed_while_the_controller_was_away_restarts_the_job(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, 0, 4.0, script=FAILS_FIRST, controller=("--remediate",))
    try:
        job.launched()
        job.kill_controller()  # before rank 1 fails
        until(lambda: not any(alive(pid) for pid in job.pids.values()))
        job.start_controller()
        finding = job.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("process_exit", 1)
        assert job.ended()["phase"] == "succeeded"
        assert job.controller.wait(timeout=60) == 0
        assert [a.wait(timeout=60) for a in job.agents] == [0, 0]
    finally:
        job.close()
    assert (tmp_path / "logs1" / "attempt-1" / "rank-1.log").exists()  # restarted as attempt 1
    actions = job.rows("SELECT kind, status FROM actions")
    assert actions == [("restart", "done")]
    job.no_rank_left()
