"""The controller of a replica job across hosts killed and restarted (network namespaces
on a bridge: `eagleeye controller --recovery replica --replicas 2` on host 0, the agents
of node ranks 0 and 1 on hosts 1 and 2, a spare on host 3): SIGKILL to the controller,
then the same command line on the same host. The quorum's store, a process of its own on
the controller's host, carries both replicas' training meanwhile; the restarted
controller reconnects to it and adopts both hosts' ranks (the same pids, never
relaunched); the job succeeds, the store keeps every row from before the kill, and no
process is left on any host (the store's included). With the controller's host lost
(the store with it) a restart is refused in one line."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.eagleeye.cluster_replica_helpers import steps
from tests.eagleeye.test_netns_replicas import ReplicaJob, running, wait_for
from tests.eagleeye.test_netns_spare import Lines
from tests.netns import NetHosts, need_netns

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
TABLES = ("events", "findings", "actions", "memberships")


def rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return {t: conn.execute(f"SELECT * FROM {t}").fetchall() for t in TABLES}
    finally:
        conn.close()


def store_pid(db: Path) -> int:
    conn = sqlite3.connect(db, timeout=30)
    try:
        ((value,),) = conn.execute("SELECT value FROM meta WHERE key = 'replica_state'")
    finally:
        conn.close()
    return int(json.loads(value)["store"]["pid"])


def test_the_replica_controller_killed_and_restarted_adopts_both_hosts_ranks(
    tmp_path: Path,
) -> None:
    need_netns()
    with NetHosts(4) as hosts:
        job = ReplicaJob(tmp_path, hosts, 5708, "replica-restart")
        logs = {
            0: tmp_path / "logs-1" / "replica-0-0" / "rank-0.log",
            1: tmp_path / "logs-2" / "replica-1-0" / "rank-1.log",
        }
        wait_for(lambda: min(len(steps(log)) for log in logs.values()) >= 5, "never stepped")
        db = tmp_path / "runs" / "replica-restart" / "run.db"
        job.controller.send_signal(signal.SIGKILL)  # the controller's process, not its host
        job.controller.wait(timeout=30)
        before = rows(db)
        store = store_pid(db)
        assert store in hosts.pids(0)  # the quorum's store outlived its controller
        at_kill = {r: steps(log)[-1] for r, log in logs.items()}
        for rank, log in logs.items():  # both replicas train on through it
            wait_for(lambda log=log, rank=rank: steps(log)[-1] >= at_kill[rank] + 5, "stalled")

        job.controller = hosts.popen(  # the same command line, on the same host
            0, job.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        job.lines = Lines(job.controller)
        job.next_line(lambda i: "listening" in i)
        adopted: dict[str, int] = {}
        while len(adopted) < 2:
            item = job.next_line(lambda i: bool(i.get("detail", {}).get("adopted")))
            adopted.update(item["detail"]["pids"])
        assert adopted == {str(r): job.first[r]["pid"] for r in (0, 1)}
        assert job.first[0]["pid"] in hosts.pids(1)
        assert job.first[1]["pid"] in hosts.pids(2)
        end_at = max(steps(log)[-1] for log in logs.values()) + 20
        job.finish.write_text(str(end_at))
        end = job.next_line(lambda i: i.get("subject") == "job" and i.get("phase") != "running")
        assert end["phase"] == "succeeded", end
        assert job.controller.wait(timeout=60) == 0
        for proc in (job.a, job.b, job.spare):
            assert proc.wait(timeout=60) == 0
        for host in range(4):
            assert hosts.pids(host) == []  # no process of the job is left, nor the store
    for log in logs.values():  # one process per replica, every step, on to the end
        done = steps(log)
        assert done == list(range(done[0], done[-1] + 1))
        assert done[-1] >= end_at
    assert not [i for i in job.seen if running(0)(i) or running(1)(i)][2:]  # none relaunched
    after = rows(db)
    for table, old in before.items():
        assert after[table][: len(old)] == old, f"rows of {table} lost"
    assert after["findings"] == []  # no host found lost, no replica restarted
    assert os.path.exists(tmp_path / "runs" / "replica-restart" / "replicas" / "quorum-store.log")


def test_the_replica_controllers_host_lost_refuses_a_restart_in_one_line(
    tmp_path: Path,
) -> None:
    """Every process of the controller's host killed (its host lost: the quorum's store
    with it): the same command line there again is refused in one line, saying why and
    what to do, and records nothing."""
    need_netns()
    with NetHosts(4) as hosts:
        job = ReplicaJob(tmp_path, hosts, 5709, "host-lost")
        log = tmp_path / "logs-1" / "replica-0-0" / "rank-0.log"
        wait_for(lambda: len(steps(log)) >= 3, "replica 0 never stepped")
        db = tmp_path / "runs" / "host-lost" / "run.db"
        for pid in hosts.pids(0):  # the controller's host: the controller and the store
            os.kill(pid, signal.SIGKILL)
        job.controller.wait(timeout=30)
        before = rows(db)
        again = hosts.popen(0, job.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = again.communicate(timeout=60)
        assert again.returncode != 0
        assert out == ""
        (line,) = err.strip().splitlines()
        assert "the replica job cannot go on" in line
        assert "give another --run-id" in line
        assert rows(db) == before
