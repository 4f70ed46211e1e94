"""A spare host through the real commands on loopback: `eagleeye controller`, agents for
node ranks 0 and 1 and `eagleeye agent --spare`. A fatal XID in node rank 1's kernel log
evicts its host: the spare takes node rank 1 (its ranks get node rank 1's environment),
every host restarts as attempt 1 and the job succeeds; the evicted host's agent ends its
ranks and says why and how to readmit the host; a spare started again on the evicted host
is refused with the reason, one started with `--readmit` is admitted; the store has the
XID finding and its `evict` action naming the spare."""

from __future__ import annotations

import json
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
print({k: os.environ[k] for k in ("RANK", "GROUP_RANK", "MASTER_ADDR")}, flush=True)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(60)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.1)
"""
EAGLEEYE = [sys.executable, "-m", "eagleeye"]


def test_an_evicted_host_is_replaced_by_the_spare_and_the_job_succeeds(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    (tmp_path / "rank.py").write_text(RANK)
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    listen = f"127.0.0.1:{free_port()}"
    common = ["--secret-file", str(tmp_path / "secret"), "--heartbeat", "0.2"]
    controller = subprocess.Popen(
        [*EAGLEEYE, "controller", "--listen", listen, "--nnodes", "2", "--remediate", *common]
        + ["--runs-dir", str(tmp_path / "runs"), "--run-id", "r"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert controller.stdout is not None
    pids: list[int] = []

    def read(want) -> dict:
        assert controller.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = controller.stdout.readline()
            assert line, "the controller ended early"
            item = json.loads(line)
            if str(item.get("subject")).startswith("rank:") and item.get("phase") == "launch":
                pids.append(int(item["detail"]["pid"]))
            if want(item):
                return dict(item)
        raise AssertionError("not seen in time")

    def agent(role: list[str], name: str, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*EAGLEEYE, "agent", "--controller", listen, *role, *common, "--no-host-metrics"]
            + [*extra, "--advertise", "127.0.0.1", "--log-dir", str(tmp_path / name)]
            + [str(tmp_path / "rank.py"), str(tmp_path / "finish")],
            stderr=subprocess.PIPE,
            text=True,
        )

    read(lambda i: "listening" in i)
    agents = []
    try:
        agents.append(agent(["--spare"], "spare", ("--hostname", "spare-host")))
        read(lambda i: i.get("phase") == "running" and i["detail"].get("spare"))
        agents.append(agent(["--node-rank", "0"], "logs0"))
        sources = ("--kernel-log", str(kernel_log), "--sources-period", "0.2")
        agents.append(agent(["--node-rank", "1"], "logs1", sources))
        read(lambda i: i.get("subject") == "rank:1" and i.get("phase") == "launch")
        with kernel_log.open("a") as f:
            f.write("[ 99.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus\n")
        finding = read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["node"]) == ("xid", "node1")
        recovering = read(lambda i: i.get("phase") == "recovering")
        assert (recovering["detail"]["node"], recovering["attempt"]) == (1, 1)
        took = recovering["detail"]["spare"]
        # every agent here runs on this machine's hostname, the evicted host's: a spare
        # started again is refused, one the operator readmits is admitted
        plain = agent(["--spare"], "plain")
        refused = read(lambda i: i.get("phase") == "exited" and "--readmit" in str(i["detail"]))
        assert "was evicted from this job (host" in refused["detail"]["reason"]
        _, plain_err = plain.communicate(timeout=60)
        assert plain.returncode == 2
        assert "eagleeye agent: refused by the controller: host" in plain_err
        agents.append(agent(["--spare", "--readmit"], "readmitted"))
        readmitted = read(lambda i: i.get("phase") == "running" and i["detail"].get("readmitted"))
        assert "-readmitted-" in readmitted["subject"]
        assert "evicted: xid" in readmitted["detail"]["readmitted"]
        (tmp_path / "finish").touch()
        end = read(
            lambda i: i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed")
        )
        assert end["phase"] == "succeeded", end
        assert controller.wait(timeout=30) == 0
        errs = [a.communicate(timeout=30)[1] for a in agents]
        assert [a.returncode for a in agents] == [0, 0, 0, 0]
        assert "eagleeye agent: evicted by the controller (host" in errs[2]  # the evicted host
        assert "evicted: xid" in errs[2]
        assert "readmit it as a spare with eagleeye agent --spare --readmit" in errs[2]
    finally:
        for proc in [controller, *agents]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
    second = (tmp_path / "spare" / "attempt-1" / "rank-1.log").read_text()
    assert "'RANK': '1'" in second
    assert "'GROUP_RANK': '1'" in second
    assert not (tmp_path / "logs1" / "attempt-1").exists()  # nothing on the evicted host
    assert (tmp_path / "logs0" / "attempt-1" / "rank-0.log").exists()
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.actions()
    assert list(zip(actions["kind"], actions["finding_kind"], strict=True)) == [("evict", "xid")]
    assert f"node rank 1 moved to the spare {took}" in actions["detail"][0]
    assert outliving(pids) == [], "rank processes outlived the run"
