"""A host lost after a checkpoint, its state restored on a spare host from the other
host's holder: `eagleeye controller --snapshots --remediate`, agents for node ranks 0 and
1 on two hosts and a spare (`eagleeye agent --spare`) on a fourth (network namespaces on
a bridge), one rank each of the reference workload. Once host B's snapshots are backed
up on host A's holder, B's link is cut: a `host_lost` finding, the spare takes node rank
1 and its holder B's place in the ring, the job restarts on hosts A and D, node rank 1's
rank restores from a holder's memory (the spare's, pulled from A's backups, or A's), not
from disk, and the job succeeds. When B's link comes back its agent ends its rank and
its holder and joins again as a spare. No process is left on any host."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagleeye.agents.wire import holder_token
from eagleeye.store import RunReader
from tests.eagleeye.test_netns_snapshots import LIST_BACKUPS as LIST
from tests.eagleeye.test_netns_spare import Lines, launched
from tests.netns import NetHosts, need_netns

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]

SECRET = b"0123456789abcdef0123456789abcdef"
HOLDER_PORT = 5721
PULLED = """
import sys
import zmq
from ft_runtime.ckpt._rpc import Rpc
rpc = Rpc(zmq.Context.instance(), sys.argv[1], 5.0, sys.argv[2])
head, _ = rpc.call({"op": "events"})
print(sum(e["error"] == "restored from the next node" for e in head["events"]))
"""


def test_a_spare_restores_a_lost_hosts_state_from_the_other_hosts_holder(
    tmp_path: Path,
) -> None:
    need_netns()
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    eagleeye = [sys.executable, "-m", "eagleeye"]
    with NetHosts(4) as hosts:
        listen = f"{hosts.addresses[0]}:5723"
        controller = hosts.popen(
            0,
            [*eagleeye, "controller", "--listen", listen, "--nnodes", "2"]
            + ["--snapshots", "--remediate", "--nproc-per-node", "1", "--heartbeat", "0.5"]
            + ["--max-restarts", "2", "--secret-file", str(tmp_path / "secret")]
            + ["--runs-dir", str(tmp_path / "runs"), "--run-id", "spare-snapshots"],
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
            argv += ["--holder-port", str(HOLDER_PORT), "--secret-file", str(tmp_path / "secret")]
            argv += ["--log-dir", str(tmp_path / f"logs-{host}"), "-m", "eagleeye.workload.train"]
            argv += ["--preset", "tiny", "--steps", "300", "--checkpoint-every", "10"]
            return hosts.popen(host, argv, env=env, stderr=subprocess.PIPE, text=True)

        spare = agent(3, ["--spare"])
        lines.next(lambda i: i.get("phase") == "running" and i["detail"].get("spare"))
        a, b = agent(1, ["--node-rank", "0"]), agent(2, ["--node-rank", "1"])
        lines.next(launched(1, 0))

        def ask(script: str, host: int, *args: str) -> list[str]:
            proc = hosts.popen(
                0,
                [sys.executable, "-c", script]
                + [f"tcp://{hosts.addresses[host]}:{HOLDER_PORT}", holder_token(SECRET), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            out, err = proc.communicate(timeout=60)
            if proc.returncode != 0:
                return ["0", err.strip().splitlines()[-1] if err.strip() else "no answer"]
            return out.split()

        def held_on_host_a(owner: str) -> tuple[int, str]:
            count, node = ask(LIST, 1, owner)
            return int(count), node

        deadline = time.monotonic() + 150
        while (held := held_on_host_a("node1"))[0] == 0:
            assert time.monotonic() < deadline, f"no backup of host B on host A: {held}"
            time.sleep(1.0)
        assert held[1] == "node0"  # host A's holder holds host B's (node1's) snapshots
        hosts.cut(2)  # host B's cable pulled, its memory out of reach

        finding = lines.next(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["node"]) == ("host_lost", "node1")
        recovering = lines.next(lambda i: i.get("phase") == "recovering")
        assert recovering["detail"]["node"] == 1
        took = recovering["detail"]["spare"]
        ranks = {}
        while set(ranks) != {0, 1}:  # the job restarts on hosts A and D as attempt 1
            item = lines.next(lambda i: launched(0, 1)(i) or launched(1, 1)(i))
            ranks[int(item["detail"]["rank"])] = item["detail"]["agent"]
        assert ranks[1] == took
        # the spare's holder, node1's in the new ring, pulled node1's snapshots from host A
        deadline = time.monotonic() + 60
        while int(ask(PULLED, 3)[0]) == 0:
            assert time.monotonic() < deadline, "the spare's holder pulled nothing from A"
            time.sleep(1.0)

        hosts.restore(2)  # B comes back: fenced, its rank and holder end, it joins again
        rejoined = lines.next(
            lambda i: i.get("phase") == "running" and i["detail"].get("rejoined_from")
        )
        assert rejoined["detail"]["spare"] is True
        assert rejoined["detail"]["ranks_ended"] is True
        b_again = rejoined["subject"].removeprefix("agent:")
        assert hosts.pids(2) == [b.pid]  # B's rank and holder are gone; only its agent lives
        assert b.poll() is None  # the agent stays, as a spare

        end = lines.next(
            lambda i: i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed"),
            limit=300,
        )
        assert end["phase"] == "succeeded", end
        assert controller.wait(timeout=60) == 0
        _, b_err = b.communicate(timeout=60)  # the job's end reaches the spare B became
        assert b.returncode == 0
        assert f"its ranks ended; joined again as the spare {b_again}" in b_err
        for proc in (a, spare):
            proc.communicate(timeout=60)
            assert proc.returncode == 0  # told to stop: ranks and holders ended
        assert (tmp_path / "logs-3" / "attempt-1" / "rank-1.log").exists()
        for host in range(4):
            assert hosts.pids(host) == []  # no process of the job is left on any host
    with RunReader(tmp_path / "runs" / "spare-snapshots") as run:
        checkpoints = run.checkpoints()
        findings = run.findings()
        actions = run.actions()
    # (the job's step time may also drop around the restart: a finding of its own)
    assert list(findings["kind"][findings["kind"] == "host_lost"]) == ["host_lost"]
    evictions = actions[actions["kind"] == "evict"]
    assert list(evictions["status"]) == ["done"]
    assert f"node rank 1 moved to the spare {took}" in evictions["detail"].iloc[0]
    restored = checkpoints[(checkpoints["state"] == "RESTORED") & (checkpoints["attempt"] == 1)]
    assert set(restored["rank"]) == {0, 1}, checkpoints
    tiers = dict(zip(restored["rank"], restored["tier"], strict=True))
    assert tiers[1] in {"memory", "peer"}, restored  # the spare's rank: not from disk
    assert tiers[0] == "memory", restored  # the survivor's rank: from its host's memory
