"""SIGTERM mid-run across hosts (network namespaces on a bridge): `eagleeye controller`
on one host, an `eagleeye agent` on each of two others, a 2-host gloo job whose loop
saves when asked (``ee.checkpoint_requested()``). SIGTERM to the controller, then in a
second run to one agent, with a grace period: every rank checkpoints at one step, the
store records the checkpoints before the stop and its cause, every rank ends, and no
process of the job is left on any host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.netns import NetHosts, need_netns
from tests.netns import read_json_line as read

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

LOOP = Path(__file__).parents[1] / "fixtures" / "scripts" / "hooked_loop.py"
EAGLEEYE = [sys.executable, "-m", "eagleeye"]


@pytest.mark.parametrize("target", ["controller", "agent"])
def test_sigterm_mid_run_checkpoints_on_every_host_then_ends_every_rank(
    tmp_path: Path, target: str
) -> None:
    need_netns()
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    grace = ["--grace-period", "40", "--heartbeat", "0.5"]
    common = [*grace, "--secret-file", str(tmp_path / "secret")]
    with NetHosts(3) as hosts:
        listen = f"{hosts.addresses[0]}:5704"
        controller = hosts.popen(
            0,
            [*EAGLEEYE, "controller", "--listen", listen, "--nnodes", "2", *common]
            + ["--runs-dir", str(tmp_path / "runs"), "--run-id", "r"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        read(controller, lambda i: "listening" in i)
        agents = []
        for node_rank, host in enumerate((1, 2)):
            env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.ifname(host)}
            argv = [*EAGLEEYE, "agent", "--controller", listen, "--node-rank", str(node_rank)]
            argv += ["--advertise", hosts.addresses[host], *common, "--no-host-metrics"]
            argv += ["--log-dir", str(tmp_path / f"logs{node_rank}"), str(LOOP)]
            agents.append(hosts.popen(host, argv, env=env, stderr=subprocess.DEVNULL))
        seen: set[str] = set()
        while seen != {"rank:0", "rank:1"}:  # both loops listen for a checkpoint request
            item = read(controller, lambda i: bool(i.get("detail", {}).get("listening")))
            seen.add(str(item["subject"]))
        (controller if target == "controller" else agents[1]).send_signal(signal.SIGTERM)
        end = read(controller, lambda i: i.get("subject") == "job" and i.get("phase") == "failed")
        assert controller.wait(timeout=60) == 1
        assert [proc.wait(timeout=60) for proc in agents] == [0, 0]
        for host in range(3):
            assert hosts.pids(host) == []  # no process of the job is left on any host
    cause = "stopped by SIGTERM" + (" to the agent" if target == "agent" else "")
    assert end["detail"]["reason"].startswith(cause)
    with RunReader(tmp_path / "runs" / "r") as run:
        saved = run.query("SELECT rank, step, time FROM checkpoints ORDER BY rank")
        stop = run.query("SELECT time FROM events WHERE subject = 'job' AND phase = 'failed'")
    assert list(saved["rank"]) == [0, 1]
    assert len(set(saved["step"])) == 1  # both left their loop at the same step
    assert max(saved["time"]) <= stop["time"][0]  # the checkpoints landed first
    for node_rank in (0, 1):
        log = (tmp_path / f"logs{node_rank}" / "attempt-0" / f"rank-{node_rank}.log").read_text()
        assert f"saved on request at step {saved['step'][0]}" in log
