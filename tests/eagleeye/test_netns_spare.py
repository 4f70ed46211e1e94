"""A spare host takes over a lost one: `eagleeye controller` on one host, agents for
node ranks 0 and 1 on two others and a spare (`eagleeye agent --spare`) on a fourth
(network namespaces on a bridge), a 2-rank gloo job. Host B's link is cut: a `host_lost`
finding, the spare takes node rank 1, the job restarts on hosts A and D as the next
attempt and succeeds. When B's link comes back its agent is fenced: told to stop, its
ranks ended, never given its node rank back; it joins the job again as a spare under a
new name, and ends with the job. No process is left on any host, and the store has the
finding, its action and B's agent joining again."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eagleeye.store import RunReader
from tests.netns import NetHosts, need_netns

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

# attempt 0 runs until it is ended; a later attempt runs until the test's FINISH file
# exists (both ranks agree on the step through an all-reduce)
SCRIPT = """
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
t = torch.ones(4)
step = 0
while True:
    dist.all_reduce(t)
    assert t[0].item() == dist.get_world_size()
    t.fill_(1.0)
    print(f"step {step}", flush=True)
    done = torch.tensor([1.0 if attempt > 0 and os.path.exists(sys.argv[1]) else 0.0])
    dist.all_reduce(done, op=dist.ReduceOp.MAX)
    if done.item() > 0 and step >= 5:
        break
    step += 1
    time.sleep(0.05)
dist.destroy_process_group()
"""


class Lines:
    """The controller's JSON lines, read on a thread so that its pipe never fills."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)

    def next(self, want: Any, limit: float = 150.0) -> dict[str, Any]:
        deadline = time.monotonic() + limit
        while True:
            item = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert item is not None, "the controller ended early"
            if want(item):
                return item


def launched(rank: int, attempt: int) -> Any:
    return lambda i: (
        i.get("subject") == f"rank:{rank}"
        and i.get("phase") == "launch"
        and i["detail"].get("attempt") == attempt
    )


def test_a_spare_takes_the_node_rank_of_a_host_whose_link_was_cut(tmp_path: Path) -> None:
    need_netns()
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    finish = tmp_path / "finish"
    eagleeye = [sys.executable, "-m", "eagleeye"]
    with NetHosts(4) as hosts:
        listen = f"{hosts.addresses[0]}:5704"
        controller = hosts.popen(
            0,
            [*eagleeye, "controller", "--listen", listen, "--nnodes", "2", "--remediate"]
            + ["--nproc-per-node", "1", "--heartbeat", "0.5", "--max-restarts", "2"]
            + ["--secret-file", str(tmp_path / "secret"), "--runs-dir", str(tmp_path / "runs")]
            + ["--run-id", "spare"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        lines = Lines(controller)
        lines.next(lambda i: "listening" in i)

        def agent(host: int, role: list[str]) -> subprocess.Popen[str]:
            env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.ifname(host)}
            argv = [*eagleeye, "agent", "--controller", listen, *role, "--no-host-metrics"]
            argv += ["--advertise", hosts.addresses[host], "--heartbeat", "0.5"]
            argv += ["--secret-file", str(tmp_path / "secret")]
            argv += ["--log-dir", str(tmp_path / f"logs-{host}"), str(script), str(finish)]
            return hosts.popen(host, argv, env=env, stderr=subprocess.PIPE, text=True)

        spare = agent(3, ["--spare"])
        lines.next(lambda i: i.get("phase") == "running" and i["detail"].get("spare"))
        a, b = agent(1, ["--node-rank", "0"]), agent(2, ["--node-rank", "1"])
        b_rank = lines.next(launched(1, 0))["detail"]
        b_name = b_rank["agent"]
        log = tmp_path / "logs-2" / "attempt-0" / "rank-1.log"
        deadline = time.monotonic() + 120
        while "step 5" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "rank 1 never stepped on host B"
            time.sleep(0.2)
        hosts.cut(2)  # host B's cable pulled

        finding = lines.next(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["node"]) == ("host_lost", "node1")
        assert finding["evidence"]["pings"] >= 1
        evicted = lines.next(lambda i: i.get("phase") == "evicted")
        assert evicted["subject"] == f"agent:{b_name}"
        recovering = lines.next(lambda i: i.get("phase") == "recovering")
        assert recovering["detail"]["node"] == 1
        took = recovering["detail"]["spare"]
        assert took.endswith("-spare")
        ranks = {}
        while set(ranks) != {0, 1}:  # the job restarts on hosts A and D as attempt 1
            item = lines.next(lambda i: launched(0, 1)(i) or launched(1, 1)(i))
            ranks[int(item["detail"]["rank"])] = item["detail"]["agent"]
        assert ranks[1] == took
        assert ranks[0].endswith("-0")

        hosts.restore(2)  # B comes back: fenced, its ranks ended, it joins again as a spare
        rejoined = lines.next(
            lambda i: i.get("phase") == "running" and i["detail"].get("rejoined_from") == b_name,
        )
        assert rejoined["detail"]["spare"] is True
        assert rejoined["detail"]["ranks_ended"] is True
        b_again = rejoined["subject"].removeprefix("agent:")
        assert b_again not in (b_name, took)
        assert hosts.pids(2) == [b.pid]  # B's old rank is gone; only its agent lives
        assert b.poll() is None  # the agent stays, as a spare

        finish.touch()
        end = lines.next(
            lambda i: i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed")
        )
        assert end["phase"] == "succeeded", end
        assert controller.wait(timeout=60) == 0
        _, b_err = b.communicate(timeout=60)  # the job's end reaches the spare B became
        assert b.returncode == 0
        assert "eagleeye agent: fenced by the controller (host" in b_err
        assert f"its ranks ended; joined again as the spare {b_again}" in b_err
        assert not (tmp_path / "logs-2" / "attempt-1").exists()  # never given a node rank
        for proc in (a, spare):
            proc.communicate(timeout=60)
            assert proc.returncode == 0  # told to stop, every rank ended
        assert "step 5" in (tmp_path / "logs-3" / "attempt-1" / "rank-1.log").read_text()
        for host in range(4):
            assert hosts.pids(host) == []  # no process of the job is left on any host
    with RunReader(tmp_path / "runs" / "spare") as run:
        findings = run.findings()
        actions = run.actions()
        events = run.events()
    again = [
        (e["phase"], e["detail"].get("rejoined_from"), e["detail"].get("ranks_ended"))
        for _, e in events.iterrows()
        if e["subject"] == f"agent:{b_again}"
    ]
    assert again == [("running", b_name, True)]
    assert list(zip(findings["kind"], findings["node"], strict=True)) == [("host_lost", "node1")]
    assert list(zip(actions["kind"], actions["status"], strict=True)) == [("evict", "done")]
    assert f"node rank 1 moved to the spare {took}" in actions["detail"][0]
