"""Snapshots across hosts: `eagleeye controller --snapshots` and an agent on each of two
hosts (network namespaces on a bridge), one rank each of the reference workload. Each
agent runs its host's snapshot holder; host A's snapshots are backed up on host B's
holder (asked over the network, with the job's token); a rank killed on host B restarts
the job, and both ranks restore their state from a holder's memory, not from disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagleeye.agents.wire import holder_token
from eagleeye.store import RunReader
from tests.netns import NetHosts, need_netns
from tests.netns import read_json_line as read

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

SECRET = b"0123456789abcdef0123456789abcdef"
HOLDER_PORT = 5711
LIST_BACKUPS = """
import sys
import zmq
from ft_runtime.ckpt._rpc import Rpc
rpc = Rpc(zmq.Context.instance(), sys.argv[1], 5.0, sys.argv[2])
head, _ = rpc.call({"op": "list", "owner": sys.argv[3]})
print(len(head["slots"]), head["node"])
"""


def test_a_hosts_snapshots_are_backed_up_on_another_host_and_restored_from_memory(
    tmp_path: Path,
) -> None:
    need_netns()
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    eagleeye = [sys.executable, "-m", "eagleeye"]
    with NetHosts(3) as hosts:
        listen = f"{hosts.addresses[0]}:5713"
        controller = hosts.popen(
            0,
            [
                *eagleeye,
                "controller",
                "--listen",
                listen,
                "--nnodes",
                "2",
                "--snapshots",
                "--remediate",
            ]
            + ["--nproc-per-node", "1", "--heartbeat", "0.5", "--max-restarts", "2"]
            + ["--secret-file", str(tmp_path / "secret"), "--runs-dir", str(tmp_path / "runs")]
            + ["--run-id", "snapshots"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        read(controller, lambda i: "listening" in i)

        def agent(host: int, node_rank: int) -> subprocess.Popen[str]:
            env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.ifname(host)}
            argv = [*eagleeye, "agent", "--controller", listen, "--node-rank", str(node_rank)]
            argv += ["--advertise", hosts.addresses[host], "--heartbeat", "0.5"]
            argv += ["--holder-port", str(HOLDER_PORT), "--secret-file", str(tmp_path / "secret")]
            argv += ["--log-dir", str(tmp_path / f"logs-{host}"), "-m", "eagleeye.workload.train"]
            argv += ["--preset", "tiny", "--steps", "300", "--checkpoint-every", "10"]
            return hosts.popen(host, argv, env=env, stderr=subprocess.DEVNULL)

        agents = [agent(1, 0), agent(2, 1)]
        victim = read(
            controller, lambda i: i.get("subject") == "rank:1" and i.get("phase") == "launch"
        )["detail"]["pid"]

        def backups_on_host_b(owner: str) -> tuple[int, str]:
            ask = hosts.popen(
                0,
                [sys.executable, "-c", LIST_BACKUPS]
                + [f"tcp://{hosts.addresses[2]}:{HOLDER_PORT}", holder_token(SECRET), owner],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            out, err = ask.communicate(timeout=60)
            if ask.returncode != 0:
                return 0, err.strip().splitlines()[-1] if err.strip() else "no answer"
            count, node = out.split()
            return int(count), node

        deadline = time.monotonic() + 150
        while (held := backups_on_host_b("node0"))[0] == 0:
            assert time.monotonic() < deadline, f"no backup of host A on host B: {held}"
            time.sleep(1.0)
        assert held[1] == "node1"  # host B's holder holds host A's (node0's) snapshots
        os.kill(victim, signal.SIGKILL)  # host B's rank dies

        finding = read(controller, lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("process_exit", 1)
        end = read(
            controller,
            lambda i: i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed"),
        )
        assert end["phase"] == "succeeded", end
        assert controller.wait(timeout=60) == 0
        for proc in agents:
            assert proc.wait(timeout=60) == 0  # told to stop: ranks and holders ended
        for host in range(3):
            assert hosts.pids(host) == []
    with RunReader(tmp_path / "runs" / "snapshots") as run:
        checkpoints = run.checkpoints()
        meta = run.meta()
    assert meta["config"]["snapshots"] is True
    saved = checkpoints[checkpoints["state"] == "CACHED"]
    assert set(saved["tier"]) == {"memory"}
    assert set(saved["rank"]) == {0, 1}
    restored = checkpoints[(checkpoints["state"] == "RESTORED") & (checkpoints["attempt"] == 1)]
    assert set(restored["rank"]) == {0, 1}, checkpoints
    assert set(restored["tier"]) <= {"memory", "peer"}, restored  # not from disk
