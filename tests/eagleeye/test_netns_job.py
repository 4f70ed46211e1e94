"""One job across two hosts: `eagleeye controller` on a third host, `eagleeye agent` on
each of two hosts (network namespaces on a bridge), 2 × 2 ranks of a gloo job with
torchrun's environment. A rank killed on host B is a finding, and the job restarts on
both agents and succeeds; an agent with a wrong secret is refused, logged and never
admitted; every process ends with the job, on every host, and the store has it all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.netns import NetHosts, need_netns
from tests.netns import read_json_line as read

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

SCRIPT = """
import os, sys, time
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


def test_a_rank_killed_on_host_b_restarts_the_job_on_both_hosts(tmp_path: Path) -> None:
    need_netns()
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    (tmp_path / "wrong").write_text("fedcba9876543210fedcba9876543210\n")
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    eagleeye = [sys.executable, "-m", "eagleeye"]
    with NetHosts(3) as hosts:
        listen = f"{hosts.addresses[0]}:5703"
        controller = hosts.popen(
            0,
            [*eagleeye, "controller", "--listen", listen, "--nnodes", "2"]
            + ["--nproc-per-node", "2", "--heartbeat", "0.5", "--max-restarts", "2", "--remediate"]
            + ["--secret-file", str(tmp_path / "secret"), "--runs-dir", str(tmp_path / "runs")]
            + ["--run-id", "two-hosts"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        read(controller, lambda i: "listening" in i)

        def agent(host: int, node_rank: int, secret: str) -> subprocess.Popen[str]:
            env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.ifname(host)}
            argv = [*eagleeye, "agent", "--controller", listen, "--node-rank", str(node_rank)]
            argv += ["--advertise", hosts.addresses[host], "--heartbeat", "0.5"]
            argv += ["--secret-file", str(tmp_path / secret)]
            argv += ["--log-dir", str(tmp_path / f"logs-{host}"), str(script), "120"]
            return hosts.popen(host, argv, env=env, stderr=subprocess.DEVNULL)

        forger = agent(2, 1, "wrong")  # on host B first: must never take node rank 1
        agents = [agent(1, 0, "secret"), agent(2, 1, "secret")]

        def launched(rank: int, attempt: int):
            return lambda i: (
                i.get("subject") == f"rank:{rank}"
                and i.get("phase") == "launch"
                and i["detail"].get("attempt") == attempt
            )

        victim = read(controller, launched(3, 0))["detail"]["pid"]
        log = tmp_path / "logs-2" / "attempt-0" / "rank-3.log"
        deadline = time.monotonic() + 120
        while "step 5" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "rank 3 never stepped"
            time.sleep(0.2)
        os.kill(victim, signal.SIGKILL)  # host B's rank 3 dies

        finding = read(controller, lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("process_exit", 3)
        relaunched: set[int] = set()
        while relaunched != {0, 1, 2, 3}:  # both agents relaunch their ranks as attempt 1
            item = read(controller, lambda i: any(launched(r, 1)(i) for r in range(4)))
            relaunched.add(int(item["detail"]["rank"]))
        end = read(
            controller,
            lambda i: i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed"),
        )
        assert end["phase"] == "succeeded", end
        assert controller.wait(timeout=60) == 0
        err = controller.stderr.read() if controller.stderr else ""
        for proc in agents:
            assert proc.wait(timeout=60) == 0  # told to stop, every rank ended
        forger.kill()
        forger.wait(timeout=10)
        assert "refused a message" in err  # the forger, logged
        for host in range(3):
            assert hosts.pids(host) == []  # no process of the job is left on any host
    with RunReader(tmp_path / "runs" / "two-hosts") as run:
        findings = run.findings()
        actions = run.actions()
    assert list(zip(findings["kind"], findings["rank"], strict=True)) == [("process_exit", 3)]
    assert list(zip(actions["kind"], actions["status"], strict=True)) == [("restart", "done")]
