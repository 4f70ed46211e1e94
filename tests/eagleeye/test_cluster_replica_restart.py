"""`eagleeye controller --recovery replica` killed (SIGKILL) mid-run and started again
with the same command line, on loopback with two agents (one replica each, replica 1
restarted once before the kill): the ranks
train on while it is away (the quorum's store lives in a process of its own), the
restarted controller reconnects to that store, resumes the quorum from its membership
log and adopts the agents' running ranks (the same pids, never relaunched) with their
incarnations and restart budgets; the job succeeds, every row from before the kill is
still in the store and no process is left (the store's either).
The refusals are one line each: flags that differ from the run's, and a run whose
quorum's store is gone."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eagleeye.store import RunStore, create_run_dir
from ft_runtime.ports import free_port
from tests.eagleeye.cluster_replica_helpers import steps
from tests.eagleeye.test_cluster_replicas import Job, Lines, running, wait_for

EAGLEEYE = [sys.executable, "-m", "eagleeye"]
TABLES = ("events", "findings", "actions", "samples", "memberships")


def rows(run: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(run / "run.db", timeout=30)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def journal(run: Path) -> dict[str, Any]:
    ((value,),) = rows(run, "SELECT value FROM meta WHERE key = 'replica_state'")
    return dict(json.loads(value))


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_killed_replica_controller_restarted_adopts_the_running_ranks(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.sources = ["--host-metrics", "--sources-period", "0.5"]  # samples in the store
    run = tmp_path / "runs" / "r"
    logs = {0: job.healthy, 1: tmp_path / "logs1" / "replica-1-1" / "rank-1.log"}
    try:
        job.start(spare=False)
        os.kill(job.first[1]["pid"], signal.SIGKILL)  # replica 1 restarts once: incarnation 1
        job.lines.next(lambda i: i.get("kind") == "process_exit")
        pids = {0: job.first[0]["pid"], 1: job.rejoined(steps(job.healthy)[-1])["pid"]}
        wait_for(lambda: len(steps(logs[1])) >= 5, "replica 1 never stepped")
        job.controller.send_signal(signal.SIGKILL)
        job.controller.wait(timeout=30)
        before = {t: rows(run, f"SELECT * FROM {t}") for t in TABLES}
        state = journal(run)
        store_pid = int(state["store"]["pid"])
        assert not gone(store_pid)  # the quorum's store outlived its controller
        at_kill = {r: steps(log)[-1] for r, log in logs.items()}
        for rank, log in logs.items():  # both replicas train on without a controller
            wait_for(lambda log=log, rank=rank: steps(log)[-1] >= at_kill[rank] + 5, "stalled")

        err = (tmp_path / "controller-2.err").open("w")
        job.controller = subprocess.Popen(
            job.argv, stdout=subprocess.PIPE, stderr=err, text=True
        )  # the same command line
        job.lines = Lines(job.controller)
        hello = job.lines.next(lambda i: "listening" in i)
        assert hello["resumed"]["incarnations"] == {"0": 0, "1": 1}
        adopted = {}
        while len(adopted) < 2:
            item = job.lines.next(
                lambda i: (
                    str(i.get("subject")).startswith("agent:")
                    and bool(i.get("detail", {}).get("adopted"))
                )
            )
            adopted.update(item["detail"]["pids"])
        assert adopted == {str(r): pid for r, pid in pids.items()}  # the same processes
        at_restart = {r: steps(log)[-1] for r, log in logs.items()}
        job.finished()  # told to stop 20 steps on: succeeded, the controller exits 0
        for proc in job.agents:
            assert proc.wait(timeout=60) == 0
        wait_for(lambda: gone(store_pid), "the quorum's store outlived the job", limit=15)
    finally:
        job.close()
    for rank, log in logs.items():  # one process each, every step committed, on past both
        done = steps(log)
        assert done == list(range(done[0], done[-1] + 1))
        assert done[-1] >= job.end_at > at_restart[rank] >= at_kill[rank] + 5
    assert not [i for i in job.lines.seen if running(0)(i) or running(1)(i)]  # none relaunched
    after = {t: rows(run, f"SELECT * FROM {t}") for t in TABLES}
    for table, old in before.items():  # every row from before the kill, as it was
        assert after[table][: len(old)] == old, table
    assert all(before[t] for t in TABLES)
    for table in ("events", "samples"):  # and the restarted controller's own
        assert len(after[table]) > len(before[table]), table
    replicas = journal(run)["supervisor"]["replicas"]  # its restart carried over, paid once
    assert replicas == {"0": [0, 0, "running", None], "1": [1, 1, "running", None]}
    (result,) = rows(run, "SELECT value FROM meta WHERE key = 'result'")[0]
    result = json.loads(result)  # one attempt of the job: a replica's restart is not one
    assert (result["succeeded"], result["attempts"]) == (True, 1)
    job.no_rank_left(job.first[1]["pid"], *pids.values())


def _replica_run(tmp_path: Path, state: dict[str, Any] | None) -> list[str]:
    """A replica run's store (two nodes, two replicas) and the controller's command line."""
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    store = RunStore(create_run_dir(tmp_path / "runs", "r"))
    config = {"nnodes": 2, "nproc_per_node": 1, "recovery": "replica", "replicas": 2}
    store.set_meta("config", {**config, "snapshots": False})
    if state is not None:
        store.set_meta("replica_state", state)
    store.close()
    return [
        *EAGLEEYE,
        "controller",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--secret-file",
        str(tmp_path / "secret"),
        "--recovery",
        "replica",
        "--nnodes",
        "2",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--run-id",
        "r",
        "--join-timeout",
        "1",
    ]


def _refused(argv: list[str]) -> str:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert time.monotonic() - started < 60
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.integration
def test_a_replica_controller_restarted_with_other_flags_is_refused(tmp_path: Path) -> None:
    line = _refused([*_replica_run(tmp_path, None), "--replicas", "1"])
    assert "was started with replicas=2" in line
    assert "same flags" in line


@pytest.mark.integration
def test_a_replica_controller_whose_quorum_store_is_gone_is_refused(tmp_path: Path) -> None:
    state = {"version": 1, "phase": "running", "store": {"address": f"127.0.0.1:{free_port()}"}}
    state["store"]["pid"] = os.getpid()  # not a store: never signalled
    line = _refused([*_replica_run(tmp_path, state), "--replicas", "2"])
    assert "the replica job cannot go on" in line
    assert "does not answer" in line
    assert "another --run-id" in line
    assert rows(tmp_path / "runs" / "r", "SELECT count(*) FROM events") == [(0,)]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_rank_that_died_while_the_replica_controller_was_away_restarts_its_replica(
    tmp_path: Path,
) -> None:
    """Rank 1 killed while no controller runs: the restarted controller adopts rank 0,
    answers rank 1's exit (its agent declares it) with a restart of replica 1 only, which
    catches up from replica 0; the job succeeds."""
    job = Job(tmp_path)
    try:
        job.start(spare=False)
        job.controller.send_signal(signal.SIGKILL)
        job.controller.wait(timeout=30)
        os.kill(job.first[1]["pid"], signal.SIGKILL)  # dies with nobody to tell
        job.controller = subprocess.Popen(
            job.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        seen = job.lines.seen
        job.lines = Lines(job.controller)
        job.lines.seen = seen  # both controllers' lines: rank 0 started once in all
        at_restart = steps(job.healthy)[-1]
        got: dict[str, dict[str, Any]] = {}  # in whatever order the agents come back
        while len(got) < 5:
            item = job.lines.next(lambda i: True)
            detail = item.get("detail", {})
            if detail.get("adopted"):
                got[f"adopted {detail['node']}"] = detail
            elif item.get("kind") == "process_exit":
                got["exit"] = item
            elif running(1)(item):
                got["started"] = detail
            elif item.get("subject") == "replica:1" and "joined_epoch" in detail:
                got["joined"] = item
        assert got["adopted 0"]["pids"] == {"0": job.first[0]["pid"]}
        assert got["adopted 1"]["pids"] == {}
        assert got["adopted 1"]["ended_meanwhile"] == {"1": -signal.SIGKILL}
        assert got["exit"]["subject"]["rank"] == 1
        assert got["started"]["pid"] != job.first[1]["pid"]  # replica 1 restarted, caught up
        wait_for(lambda: steps(job.healthy)[-1] > at_restart, "replica 0 stopped stepping")
        job.finished()
        for proc in job.agents:
            assert proc.wait(timeout=60) == 0
    finally:
        job.close()
    job.check_healthy(tmp_path / "logs1" / "replica-1-1" / "rank-1.log", at_restart)
    replicas = journal(tmp_path / "runs" / "r")["supervisor"]["replicas"]
    assert replicas["1"][:2] == [1, 1]  # incarnation 1, one restart paid
