"""The controller of a job across two hosts killed and restarted (network namespaces on a
bridge: `eagleeye controller` on one host, an `eagleeye agent` on each of two others, a
gloo job of one rank per host): SIGKILL to every process of the controller's host, then
the same command line there again. The ranks train on throughout (the same pids, the
steps go on), the restarted controller adopts them, the job succeeds, the store keeps
every record from before the kill, and no process is left on any host."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.netns import NetHosts, need_netns
from tests.netns import read_json_line as read

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

SCRIPT = """
import sys, time
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
t = torch.ones(4)
for step in range(int(sys.argv[1])):
    dist.all_reduce(t)
    assert t[0].item() == dist.get_world_size()
    t.fill_(1.0)
    print(f"step {step}", flush=True)
    time.sleep(0.05)
dist.destroy_process_group()
"""
STEPS = 500


def last_step(log: Path) -> int:
    steps = re.findall(r"^step (\d+)$", log.read_text() if log.exists() else "", re.M)
    return int(steps[-1]) if steps else -1


def rows(db: Path) -> dict[str, set[tuple]]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return {t: set(conn.execute(f"SELECT * FROM {t}")) for t in ("events", "findings")}
    finally:
        conn.close()


def test_the_controllers_host_killed_and_restarted_adopts_both_hosts_ranks(
    tmp_path: Path,
) -> None:
    need_netns()
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    eagleeye = [sys.executable, "-m", "eagleeye"]
    with NetHosts(3) as hosts:
        listen = f"{hosts.addresses[0]}:5713"
        command = (
            [*eagleeye, "controller", "--listen", listen, "--nnodes", "2", "--heartbeat", "0.5"]
            + ["--secret-file", str(tmp_path / "secret"), "--runs-dir", str(tmp_path / "runs")]
            + ["--run-id", "restarted", "--remediate"]
        )

        def controller() -> subprocess.Popen[str]:
            proc = hosts.popen(0, command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            read(proc, lambda i: "listening" in i)
            return proc

        first = controller()
        agents = []
        for host in (1, 2):
            env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.ifname(host)}
            argv = [*eagleeye, "agent", "--controller", listen, "--node-rank", str(host - 1)]
            argv += ["--advertise", hosts.addresses[host], "--heartbeat", "0.5"]
            argv += ["--secret-file", str(tmp_path / "secret"), "--no-host-metrics"]
            argv += ["--log-dir", str(tmp_path / f"logs-{host}"), str(script), str(STEPS)]
            agents.append(hosts.popen(host, argv, env=env, stderr=subprocess.DEVNULL))
        pids: dict[int, int] = {}
        while len(pids) < 2:
            item = read(first, lambda i: i.get("phase") == "launch" and "pid" in i["detail"])
            pids[int(item["detail"]["rank"])] = int(item["detail"]["pid"])
        logs = [tmp_path / f"logs-{h}" / "attempt-0" / f"rank-{h - 1}.log" for h in (1, 2)]
        deadline = time.monotonic() + 120
        while min(map(last_step, logs)) < 20:
            assert time.monotonic() < deadline, "the ranks never stepped"
            time.sleep(0.2)
        db = tmp_path / "runs" / "restarted" / "run.db"
        before = rows(db)
        for pid in hosts.pids(0):  # every process of the controller's host
            os.kill(pid, signal.SIGKILL)
        first.wait(timeout=30)
        at_kill = min(map(last_step, logs))
        deadline = time.monotonic() + 30
        while min(map(last_step, logs)) <= at_kill:  # training goes on without a controller
            assert time.monotonic() < deadline, "the ranks stopped with their controller"
            time.sleep(0.1)
        second = controller()  # the same command line, on the same host
        adopted = [read(second, lambda i: bool(i.get("detail", {}).get("adopted"))) for _ in "ab"]
        assert {int(p) for a in adopted for p in a["detail"]["pids"].values()} == set(pids.values())
        end = read(
            second,
            lambda i: i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed"),
        )
        assert end["phase"] == "succeeded", end
        assert second.wait(timeout=60) == 0
        assert [a.wait(timeout=60) for a in agents] == [0, 0]
        for host in range(3):
            assert hosts.pids(host) == []  # no process of the job is left on any host
    assert [last_step(log) for log in logs] == [STEPS - 1, STEPS - 1]
    assert not (tmp_path / "logs-1" / "attempt-1").exists()  # never relaunched
    after = rows(db)
    for table, kept in before.items():
        assert kept <= after[table], f"rows of {table} lost"
    assert after["findings"] == set()  # no host found lost by the restart
    launched = [e for e in after["events"] if e[3] == "launch" and str(e[2]).startswith("rank:")]
    assert sorted(json.loads(e[5])["pid"] for e in launched) == sorted(pids.values())
