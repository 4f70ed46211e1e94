"""Spare hosts on loopback, with the real Membership and the controller's JobCoordinator
over real sockets and a real run store; the hosts are driven by hand (signed messages on
a DEALER socket each), so a host "loses its link" by going quiet and "comes back" by
speaking again on the same connection. A lost or evicted node rank goes to the spare
(node rank 0's replacement moves MASTER_ADDR), every host restarts as the next attempt,
the lost host is fenced (told to stop, its late reports refused, its hello too) and, once
its ranks ended, joins again as a spare under a new name, which can take a node rank
later (a real `eagleeye agent` too, its link "cut" by stopping its process); with the
restart budget spent the spare is left unused and the job stops; with --snapshots the
spare's holder takes the lost node's place in the ring the restart carries, a spare that
declared no holder is refused with the reason, a lost host joins again as a spare too (a
real agent's holder ends with its ranks and starts fresh, empty, when it is given a node
rank again), and with no spare a lost host's agent is only fenced, and ends. An evicted
host is told so and stays out: a spare on that host is refused unless it says
``readmit`` (``eagleeye agent --spare --readmit``), and a readmitted one can take a node
rank."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from eagleeye.agents import Membership, Message
from eagleeye.agents.coordinator import JobCoordinator, readmit_refusal
from eagleeye.agents.spares import NO_HOLDER_REFUSAL
from eagleeye.agents.wire import holder_token, seal, unseal
from eagleeye.store import RunReader, RunStore
from eagleeye.summary import run_finding_lines
from ft_runtime.ckpt.config import ring_text
from ft_runtime.layout import JobLayout
from ft_runtime.types import LifecycleEvent, Phase

pytestmark = pytest.mark.timeout(120)
SECRET = b"0123456789abcdef0123456789abcdef"
PERIOD_S = 0.2


class Host:
    """One host's agent, by hand: a hello, heartbeats while ``beating``, what it got."""

    def __init__(
        self,
        address: str,
        name: str,
        node_rank: int,
        spare: bool = False,
        holder: str = "",
        **info: Any,
    ) -> None:
        self.name = name
        self.holder = holder
        self.address = f"10.9.9.{node_rank + 2}" if not spare else "10.9.9.99"
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.session = secrets.token_hex(8)
        self.seq = 0
        self.beating = True
        self.got: list[Message] = []
        self.hello(node_rank, spare, **info)

    def hello(self, node_rank: int, spare: bool = False, **info: Any) -> None:
        body = {"host": self.name, "node_rank": node_rank, "address": self.address}
        self.send("hello", {**body, "spare": spare, "holder": self.holder, **info})

    def send(self, kind: str, body: dict[str, Any]) -> None:
        self.seq += 1
        message = Message(kind, self.name, self.session, self.seq, body)
        self.socket.send_multipart(seal(SECRET, message))

    def pump(self) -> None:
        if self.beating:
            self.send("heartbeat", {})
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.got.append(unseal(SECRET, frames))

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [dict(m.body) for m in self.got if m.kind == kind]

    def close(self) -> None:
        self.socket.close(linger=0)


def pump(hosts: list[Host], until: Callable[[], object], limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for host in hosts:
            host.pump()
        if until():
            return
        time.sleep(0.04)
    raise AssertionError("not seen in time")


class Job:
    """The controller's coordinator on its own thread, over a real Membership."""

    def __init__(
        self,
        tmp: Path,
        max_restarts: int = 2,
        snapshots: bool = False,
        period_s: float = PERIOD_S,
    ) -> None:
        self.members = Membership(SECRET, period_s=period_s)
        self.run_dir = tmp / "run"
        self.run_dir.mkdir()
        self.store = RunStore(self.run_dir)
        self.coordinator = JobCoordinator(
            self.members,
            JobLayout(2, 1),
            self.store,
            max_restarts=max_restarts,
            snapshots=snapshots,
            dry_run=False,  # `eagleeye controller --remediate`
        )
        self.events: list[LifecycleEvent] = []  # what the controller prints
        self.coordinator.on_update = lambda item: (
            self.events.append(item) if isinstance(item, LifecycleEvent) else None
        )
        self.result: list[Phase] = []
        self.thread = threading.Thread(
            target=lambda: self.result.append(self.coordinator.run(30.0, 60.0)), daemon=True
        )

    def start(self) -> Job:
        self.thread.start()
        return self

    def close(self) -> None:
        self.coordinator.request_stop("the test's end")
        self.thread.join(timeout=30)
        self.store.close()
        self.members.close()


@contextmanager
def two_hosts_and_a_spare(
    tmp: Path, **options: Any
) -> Iterator[tuple[Job, list[Host], Host, list[Host]]]:
    """A running job of node ranks 0 and 1 (hosts ``h0``, ``h1``) and a spare ``hs``;
    every host in the yielded list (a test may add more) is closed at the end."""
    job = Job(tmp, **options)
    nodes = [Host(job.members.address, f"h{n}", n) for n in range(2)]
    spare = Host(job.members.address, "hs", -1, spare=True)
    hosts = [*nodes, spare]
    job.start()
    try:
        yield job, nodes, spare, hosts
    finally:
        job.close()
        for host in hosts:
            host.close()


def restarted(host: Host, attempt: int) -> dict[str, Any] | None:
    return next((b for b in host.kinds("restart") if b["attempt"] == attempt), None)


@pytest.mark.parametrize("lost", [1, 0])
def test_a_lost_node_rank_goes_to_the_spare_and_the_lost_host_is_fenced(
    tmp_path: Path, lost: int
) -> None:
    with two_hosts_and_a_spare(tmp_path) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        assert [h.kinds("launch")[0]["node_rank"] for h in nodes] == [0, 1]
        assert spare.kinds("launch") == []  # a spare runs no ranks
        nodes[lost].beating = False  # its link is cut: no heartbeat, no pong
        stay = nodes[1 - lost]
        pump(hosts, lambda: restarted(spare, 1) and restarted(stay, 1))
        took, kept = restarted(spare, 1), restarted(stay, 1)
        assert took is not None
        assert kept is not None
        assert (took["node_rank"], kept["node_rank"]) == (lost, 1 - lost)
        master = spare.address if lost == 0 else nodes[0].address  # node rank 0's host
        assert took["master_addr"] == kept["master_addr"] == master
        assert nodes[lost].kinds("restart") == []  # nothing restarted onto the lost host

        # the link comes back: a late report on the same connection is refused and
        # answered with a stop; a new hello of the same agent is refused too
        back = nodes[lost]
        back.send("exit", {"rank": lost, "code": 1, "attempt": 0})
        pump(hosts, lambda: back.kinds("stop"))
        assert "was lost" in back.kinds("stop")[0]["fenced"]
        back.session = secrets.token_hex(8)
        back.seq = 0
        back.hello(lost)
        pump(hosts, lambda: job.members.refused["fenced"] >= 2)
        assert back.kinds("welcome") == [{"period_s": PERIOD_S}]  # only its first hello's

        stay.send("exit", {"rank": 1 - lost, "code": 0, "attempt": 1})
        spare.send("exit", {"rank": lost, "code": 0, "attempt": 1})
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.SUCCEEDED]
        pump(hosts, lambda: spare.kinds("stop") and stay.kinds("stop"))  # the end, to both
    with RunReader(job.run_dir) as run:
        findings = run.findings()
        actions = run.actions()
    assert list(zip(findings["kind"], findings["node"], strict=True)) == [
        ("host_lost", f"node{lost}")
    ]
    assert list(zip(actions["kind"], actions["status"], strict=True)) == [("evict", "done")]
    assert f"node rank {lost} moved to the spare hs" in actions["detail"][0]
    assert "attempt 1" in actions["detail"][0]
    # the summary names the lost host, not the spare that took its node rank
    lines = run_finding_lines(str(job.run_dir))
    assert [(line.kind, line.host) for line in lines] == [("host_lost", f"h{lost}")]


def test_an_evicted_host_is_replaced_by_the_spare(tmp_path: Path) -> None:
    with two_hosts_and_a_spare(tmp_path) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        xid = {"name": "gpu_xid", "value": 79.0, "time": time.time(), "labels": {"node": "node1"}}
        nodes[1].send("samples", {"samples": [xid, xid]})  # two findings, one eviction
        pump(hosts, lambda: restarted(spare, 1) and nodes[1].kinds("stop"))
        stop = nodes[1].kinds("stop")[0]
        assert "evicted: xid" in stop["fenced"]
        assert stop["evicted"] is True  # suspected hardware: its agent stays out
        assert "rejoin" not in stop
        nodes[1].send("samples", {"samples": [xid]})  # refused: never acted on again
        pump(hosts, lambda: job.members.refused["fenced"] >= 1)
        nodes[0].send("exit", {"rank": 0, "code": 0, "attempt": 1})
        spare.send("exit", {"rank": 1, "code": 0, "attempt": 1})
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.SUCCEEDED]
    with RunReader(job.run_dir) as run:
        actions = run.actions()
    assert list(zip(actions["kind"], actions["finding_kind"], strict=True)) == [("evict", "xid")]
    assert "moved to the spare hs" in actions["detail"][0]
    assert [(line.kind, line.host) for line in run_finding_lines(str(job.run_dir))] == [
        ("xid", "h1")
    ]


def test_with_the_budget_spent_the_spare_is_left_and_the_job_stops(tmp_path: Path) -> None:
    with two_hosts_and_a_spare(tmp_path, max_restarts=0) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        nodes[1].beating = False
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.FAILED]
        pump(hosts, lambda: spare.kinds("stop"))  # the job's end
        assert spare.kinds("restart") == []
    with RunReader(job.run_dir) as run:
        actions = run.actions()
    assert list(zip(actions["kind"], actions["finding_kind"], strict=True)) == [
        ("evict", "host_lost")
    ]
    assert "restart budget is spent" in actions["detail"][0]


@pytest.mark.parametrize("lost", [1, 0])
def test_with_snapshots_the_spares_holder_takes_the_lost_nodes_place_in_the_ring(
    tmp_path: Path, lost: int
) -> None:
    job = Job(tmp_path, snapshots=True)
    holders = ["tcp://10.9.9.2:5600", "tcp://10.9.9.3:5600", "tcp://10.9.9.99:5600"]
    nodes = [Host(job.members.address, f"h{n}", n, holder=holders[n]) for n in range(2)]
    spare = Host(job.members.address, "hs", -1, spare=True, holder=holders[2])
    hosts = [*nodes, spare]
    job.start()
    try:
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        first = f"node0={holders[0]},node1={holders[1]}"
        assert [h.kinds("launch")[0]["snapshots"] for h in nodes] == [first, first]
        nodes[lost].beating = False
        stay = nodes[1 - lost]
        pump(hosts, lambda: restarted(spare, 1) and restarted(stay, 1))
        took, kept = restarted(spare, 1), restarted(stay, 1)
        assert took is not None
        assert kept is not None
        new = dict(enumerate(holders[:2]))
        new[lost] = holders[2]  # the spare's holder in the lost node's place
        ring = f"node0={new[0]},node1={new[1]}"
        assert took["snapshots"] == kept["snapshots"] == ring
        assert took["node_rank"] == lost
    finally:
        job.close()
        for h in hosts:
            h.close()


def test_a_spare_without_a_holder_is_refused_by_a_controller_with_snapshots(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, snapshots=True)
    spare = Host(job.members.address, "hs", -1, spare=True)
    job.start()
    try:
        pump([spare], lambda: spare.kinds("stop"))
        assert spare.kinds("stop")[0] == {"refused": NO_HOLDER_REFUSAL}
        spare.send("heartbeat", {})
        pump([spare], lambda: job.members.refused["fenced"] >= 1)
    finally:
        job.close()
        spare.close()


def test_spare_and_node_rank_are_exclusive(tmp_path: Path) -> None:
    (tmp_path / "s").write_text("0123456789abcdef0123456789abcdef\n")
    argv = [sys.executable, "-m", "eagleeye", "agent", "--controller", "127.0.0.1:1"]
    argv += ["--secret-file", str(tmp_path / "s")]
    both = subprocess.run(
        [*argv, "--spare", "--node-rank", "1", "x.py"], capture_output=True, text=True
    )
    assert both.returncode == 2
    assert "argument --node-rank: not allowed with argument --spare" in both.stderr
    neither = subprocess.run([*argv, "x.py"], capture_output=True, text=True)
    assert neither.returncode == 2
    assert "one of the arguments --node-rank --spare is required" in neither.stderr


def test_a_spare_agent_without_a_holder_refused_by_a_snapshots_controller_says_why(
    tmp_path: Path,
) -> None:
    (tmp_path / "s").write_bytes(SECRET + b"\n")
    job = Job(tmp_path, snapshots=True).start()
    try:
        host, port = job.members.address.removeprefix("tcp://").rsplit(":", 1)
        agent = subprocess.run(
            [sys.executable, "-m", "eagleeye", "agent", "--controller", f"{host}:{port}"]
            + ["--secret-file", str(tmp_path / "s"), "--spare", "--heartbeat", "0.2"]
            + ["--advertise", "no-such-host.invalid", "--log-dir", str(tmp_path / "logs")]
            + ["x.py"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        job.close()
    assert agent.returncode == 2
    assert f"eagleeye agent: refused by the controller: {NO_HOLDER_REFUSAL}\n" in agent.stderr


def test_another_agent_claiming_a_held_node_rank_is_refused(tmp_path: Path) -> None:
    with two_hosts_and_a_spare(tmp_path) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        nodes[1].beating = False
        pump(hosts, lambda: restarted(spare, 1))
        claimant = Host(job.members.address, "h9", 1)  # node rank 1 is the spare's now
        hosts.append(claimant)
        pump(hosts, lambda: claimant.kinds("stop"))
        assert claimant.kinds("stop")[0] == {"refused": "node rank 1 is held by hs in this job"}
        nodes[0].send("exit", {"rank": 0, "code": 0, "attempt": 1})
        spare.send("exit", {"rank": 1, "code": 0, "attempt": 1})
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.SUCCEEDED]
        assert claimant.kinds("restart") == []


def test_a_fenced_host_joins_again_as_a_spare_and_can_take_a_node_rank_later(
    tmp_path: Path,
) -> None:
    with two_hosts_and_a_spare(tmp_path, max_restarts=3) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        nodes[1].beating = False  # h1's link is cut: hs takes node rank 1 as attempt 1
        pump(hosts, lambda: restarted(spare, 1))
        back = nodes[1]
        back.send("heartbeat", {})  # the link comes back: told to stop, and as whom to rejoin
        pump(hosts, lambda: back.kinds("stop"))
        stop = back.kinds("stop")[0]
        assert "was lost" in stop["fenced"]
        assert stop["rejoin"] == "h1-spare"

        # a hello as that spare that does not say its ranks ended is refused
        early = Host(job.members.address, "h1-early", -1, spare=True, rejoined_from="h1")
        hosts.append(early)
        pump(hosts, lambda: early.kinds("stop"))
        assert "before its ranks ended" in early.kinds("stop")[0]["refused"]
        early.close()
        hosts.remove(early)

        # its ranks ended, it says hello as the spare it was told (a new connection, a
        # new session, no node rank)
        again = Host(
            job.members.address,
            stop["rejoin"],
            -1,
            True,
            host="h1",
            rejoined_from="h1",
            ranks_ended=True,
        )
        hosts.append(again)
        pump(hosts, lambda: job.members.agents.get("h1-spare") is not None)
        # under its old identity everything stays refused, never acted on
        fenced = job.members.refused["fenced"]
        back.send("exit", {"rank": 1, "code": 1, "attempt": 1})
        back.session, back.seq = secrets.token_hex(8), 0
        back.hello(1)  # and its node rank is not given back
        pump(hosts, lambda: job.members.refused["fenced"] >= fenced + 2)
        assert back.kinds("restart") == []
        assert again.kinds("restart") == []
        assert job.coordinator.phase is Phase.RUNNING  # the refused exit failed nothing

        spare.beating = False  # now hs is lost: the host that joined again takes node rank 1
        pump(hosts, lambda: restarted(again, 2) and restarted(nodes[0], 2))
        assert restarted(again, 2)["node_rank"] == 1  # type: ignore[index]
        assert spare.kinds("stop")[0]["rejoin"] == "hs-spare"
        nodes[0].send("exit", {"rank": 0, "code": 0, "attempt": 2})
        again.send("exit", {"rank": 1, "code": 0, "attempt": 2})
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.SUCCEEDED]
        pump(hosts, lambda: again.kinds("stop"))  # the job's end reaches it too
    with RunReader(job.run_dir) as run:
        events = run.events()
        actions = run.actions()
    joined = [
        (e["subject"], e["detail"].get("rejoined_from"), e["detail"].get("ranks_ended"))
        for _, e in events.iterrows()
        if e["phase"] == "running" and e["detail"].get("spare")
    ]
    assert joined == [("agent:hs", None, None), ("agent:h1-spare", "h1", True)]
    assert [d.split(";")[0] for d in actions["detail"]] == [
        "node rank 1 moved to the spare hs on hs",
        "node rank 1 moved to the spare h1-spare on h1",
    ]


def test_with_no_spare_a_lost_host_is_only_fenced_not_asked_to_join_again(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, snapshots=True)
    nodes = [Host(job.members.address, f"h{n}", n) for n in range(2)]
    for n, node in enumerate(nodes):  # each declares a snapshot holder
        node.hello(n, holder=f"tcp://10.9.9.{n + 2}:7000")
    job.start()
    try:
        pump(nodes, lambda: all(h.kinds("launch") for h in nodes))
        nodes[1].beating = False
        pump(nodes, lambda: job.result)
        assert job.result == [Phase.FAILED]  # no spare is taken: the job stops
        back = nodes[1]
        back.send("heartbeat", {})
        pump(nodes, lambda: back.kinds("stop"))
        assert "rejoin" not in back.kinds("stop")[0]  # not asked back: its agent ends
        assert "evicted" not in back.kinds("stop")[0]
    finally:
        job.close()
        for host in nodes:
            host.close()


def test_an_evicted_host_stays_out_until_its_spare_is_readmitted(tmp_path: Path) -> None:
    with two_hosts_and_a_spare(tmp_path, max_restarts=3) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        xid = {"name": "gpu_xid", "value": 79.0, "time": time.time(), "labels": {"node": "node1"}}
        nodes[1].send("samples", {"samples": [xid]})
        pump(hosts, lambda: restarted(spare, 1) and nodes[1].kinds("stop"))
        cause = nodes[1].kinds("stop")[0]["fenced"]
        assert nodes[1].kinds("stop")[0]["evicted"] is True

        # an agent started again on that host as a plain spare (a supervisor restarting
        # it, say) is refused: suspected hardware does not silently come back
        plain = Host(job.members.address, "h1-spare", -1, spare=True, host="h1")
        hosts.append(plain)
        pump(hosts, lambda: plain.kinds("stop"))
        assert plain.kinds("stop")[0] == {"refused": readmit_refusal("h1", cause)}
        assert "--spare --readmit" in plain.kinds("stop")[0]["refused"]

        # the operator checked the host and readmits it
        readmitted = Host(
            job.members.address, "h1-readmitted-1", -1, spare=True, host="h1", readmit=True
        )
        hosts.append(readmitted)
        pump(hosts, lambda: job.members.agents.get("h1-readmitted-1") is not None)
        assert readmitted.kinds("stop") == []
        spare.beating = False  # now hs is lost: the readmitted host takes node rank 1
        pump(hosts, lambda: restarted(readmitted, 2) and restarted(nodes[0], 2))
        assert restarted(readmitted, 2)["node_rank"] == 1  # type: ignore[index]
        assert plain.kinds("restart") == []
        nodes[0].send("exit", {"rank": 0, "code": 0, "attempt": 2})
        readmitted.send("exit", {"rank": 1, "code": 0, "attempt": 2})
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.SUCCEEDED]
    with RunReader(job.run_dir) as run:
        events = run.events()
    spares = [
        (e["subject"], e["phase"], e["detail"].get("readmitted"), e["detail"].get("reason"))
        for _, e in events.iterrows()
        if e["subject"] in ("agent:h1-spare", "agent:h1-readmitted-1")
    ]
    assert spares == [
        ("agent:h1-spare", "exited", None, readmit_refusal("h1", cause)),
        ("agent:h1-readmitted-1", "running", cause, None),
    ]


def test_with_snapshots_a_lost_host_joins_again_as_a_spare_and_its_holder_is_used_later(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, max_restarts=3, snapshots=True)
    holders = ["tcp://10.9.9.2:5600", "tcp://10.9.9.3:5600", "tcp://10.9.9.99:5600"]
    nodes = [Host(job.members.address, f"h{n}", n, holder=holders[n]) for n in range(2)]
    spare = Host(job.members.address, "hs", -1, spare=True, holder=holders[2])
    hosts = [*nodes, spare]
    job.start()
    try:
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        nodes[1].beating = False  # h1's link is cut: hs takes node rank 1 as attempt 1
        pump(hosts, lambda: restarted(spare, 1))
        back = nodes[1]
        back.send("heartbeat", {})
        pump(hosts, lambda: back.kinds("stop"))
        stop = back.kinds("stop")[0]
        assert stop["rejoin"] == "h1-spare"  # with --snapshots too
        again = Host(
            job.members.address,
            stop["rejoin"],
            -1,
            True,
            holders[1],  # its holder ended with its ranks; it starts again, empty, when used
            host="h1",
            rejoined_from="h1",
            ranks_ended=True,
        )
        hosts.append(again)
        pump(hosts, lambda: job.members.agents.get("h1-spare") is not None)
        assert again.kinds("stop") == []
        spare.beating = False  # hs is lost: the host that joined again takes node rank 1
        pump(hosts, lambda: restarted(again, 2) and restarted(nodes[0], 2))
        took, kept = restarted(again, 2), restarted(nodes[0], 2)
        assert took is not None
        assert kept is not None
        ring = f"node0={holders[0]},node1={holders[1]}"
        assert took["snapshots"] == kept["snapshots"] == ring
        assert took["node_rank"] == 1
    finally:
        job.close()
        for host in hosts:
            host.close()


SLEEPER = "import time\ntime.sleep(600)\n"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def real_agent(tmp_path: Path, job: Job, *role: str) -> subprocess.Popen[str]:
    """`eagleeye agent` on host "hb" (loopback) running the sleeper for ``job``."""
    (tmp_path / "s").write_bytes(SECRET + b"\n")
    (tmp_path / "sleep.py").write_text(SLEEPER)
    host, port = job.members.address.removeprefix("tcp://").rsplit(":", 1)
    return subprocess.Popen(
        [sys.executable, "-m", "eagleeye", "agent", "--controller", f"{host}:{port}"]
        + ["--secret-file", str(tmp_path / "s"), *role, "--heartbeat", "0.2"]
        + ["--hostname", "hb", "--advertise", "127.0.0.1", "--no-host-metrics"]
        + ["--gpu-metrics", "off", "--log-dir", str(tmp_path / "logs"), str(tmp_path / "sleep.py")],
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_real_agent_whose_link_was_cut_ends_its_rank_and_joins_again_as_a_spare(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    node0 = Host(job.members.address, "h0", 0)
    hosts = [node0, Host(job.members.address, "hs", -1, spare=True)]
    agent = real_agent(tmp_path, job, "--node-rank", "1")
    job.start()
    try:
        pump(hosts, lambda: job.coordinator.phase is Phase.RUNNING and node0.kinds("launch"))
        pump(hosts, lambda: rank_pid(job) is not None)
        pid = rank_pid(job)
        assert pid is not None
        assert alive(pid)
        agent.send_signal(signal.SIGSTOP)  # its link is cut: no heartbeat, no pong
        try:
            pump(hosts, lambda: restarted(hosts[1], 1))
        finally:
            agent.send_signal(signal.SIGCONT)  # the link comes back
        pump(hosts, lambda: job.members.agents.get("hb-spare") is not None)
        assert not alive(pid)  # its rank ended before it joined as a spare
        assert job.members.agents["hb-spare"].info["rejoined_from"] == "hb-1"
        node0.send("exit", {"rank": 0, "code": 0, "attempt": 1})
        hosts[1].send("exit", {"rank": 1, "code": 0, "attempt": 1})
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.SUCCEEDED]
        _, err = agent.communicate(timeout=60)  # the job's end stops the spare it became
        assert agent.returncode == 0
        assert "its ranks ended; joined again as the spare hb-spare" in err
        assert not (tmp_path / "logs" / "attempt-1").exists()  # never given a node rank
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
        job.close()
        for h in hosts:
            h.close()


def rank_pid(job: Job) -> int | None:
    """The pid of rank 1 of attempt 0 as its agent reported it (the store's events)."""
    for event in list(job.events):
        if event.subject == "rank:1" and event.phase is Phase.LAUNCH and "pid" in event.detail:
            return int(event.detail["pid"])  # type: ignore[arg-type]
    return None


def held(endpoint: str, owner: str) -> list[int] | None:
    """The steps of ``owner``'s snapshots a holder has (None: it does not answer)."""
    from ft_runtime.ckpt._rpc import Rpc
    from ft_runtime.errors import CheckpointError

    rpc = Rpc(zmq.Context.instance(), endpoint, 0.5, holder_token(SECRET))
    try:
        head, _ = rpc.call({"op": "list", "owner": owner})
    except CheckpointError:
        return None
    finally:
        rpc.close()
    return sorted(s["step"] for s in head["slots"])


def listening(endpoint: str) -> bool:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) == 0


def test_with_snapshots_a_real_agent_whose_link_was_cut_joins_again_its_holder_fresh(
    tmp_path: Path,
) -> None:
    from datetime import timedelta

    import torch

    from ft_runtime.ckpt import CheckpointClient, ClientConfig
    from ft_runtime.ckpt.config import parse_ring

    # a period long enough that the hosts driven by hand stay alive while the test asks
    # the holder and saves into it between two pumps
    job = Job(tmp_path, max_restarts=3, snapshots=True, period_s=1.0)
    node0 = Host(job.members.address, "h0", 0, holder="tcp://127.0.0.1:9")  # nobody serves
    spare = Host(job.members.address, "hs", -1, spare=True, holder="tcp://127.0.0.1:8")
    hosts = [node0, spare]
    agent = real_agent(tmp_path, job, "--node-rank", "1")
    job.start()
    try:
        pump(hosts, lambda: job.coordinator.phase is Phase.RUNNING and node0.kinds("launch"))
        ring = parse_ring(node0.kinds("launch")[0]["snapshots"])
        mine = ring.endpoint("node1")  # the real agent's holder
        pump(hosts, lambda: rank_pid(job) is not None and held(mine, "node1") == [])
        pid = rank_pid(job)
        assert pid is not None
        cfg = ClientConfig("node1", ring, timeout=timedelta(seconds=2), token=holder_token(SECRET))
        client = CheckpointClient(cfg)
        try:
            assert client.save({"w": torch.ones(1000), "step": 10}, 10).ok
        finally:
            client.close()
        pump(hosts, lambda: held(mine, "node1") == [10])

        agent.send_signal(signal.SIGSTOP)  # its link is cut: hs takes node rank 1
        try:
            pump(hosts, lambda: restarted(spare, 1))
        finally:
            agent.send_signal(signal.SIGCONT)  # the link comes back
        pump(hosts, lambda: job.members.agents.get("hb-spare") is not None)
        joined = job.members.agents["hb-spare"].info
        assert (joined["rejoined_from"], joined["ranks_ended"]) == ("hb-1", True)
        assert joined["holder"] == mine
        assert not alive(pid)  # its rank ended, and its holder with it, before it joined
        assert not listening(mine)

        spare.beating = False  # hs is lost: hb, a spare now, takes node rank 1 again
        pump(hosts, lambda: restarted(node0, 2))
        assert restarted(node0, 2)["snapshots"] == ring_text(ring)  # type: ignore[index]
        answers: list[list[int] | None] = []
        pump(hosts, lambda: answers.append(held(mine, "node1")) or answers[-1] is not None)
        assert answers[-1] == []  # a fresh holder: nothing of its earlier life
        pump(  # its rank 1 of attempt 2 launched, beside the new holder
            hosts,
            lambda: any(
                e.subject == "rank:1" and e.attempt == 2 and e.detail.get("agent") == "hb-spare"
                for e in list(job.events)
                if e.phase is Phase.LAUNCH
            ),
        )
    finally:
        job.close()
        try:
            _, err = agent.communicate(timeout=60)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
        for h in hosts:
            h.close()
    assert agent.returncode == 0
    assert "its ranks ended; joined again as the spare hb-spare" in err


def test_readmit_needs_spare(tmp_path: Path) -> None:
    (tmp_path / "s").write_bytes(SECRET + b"\n")
    argv = [sys.executable, "-m", "eagleeye", "agent", "--controller", "127.0.0.1:1"]
    argv += ["--secret-file", str(tmp_path / "s"), "--node-rank", "1", "--readmit", "x.py"]
    got = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert got.returncode == 2
    assert "--readmit needs --spare" in got.stderr
