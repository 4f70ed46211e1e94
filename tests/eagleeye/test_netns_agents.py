"""Agents on two hosts and the controller on a third (network namespaces on a bridge):
both agents are admitted with the job's shared secret and execute the controller's action;
an agent with a wrong secret is refused, logged and never admitted; every process of one
host killed (host loss) loses that agent, judged on the controller's clock after its
pings went unanswered, while the other agent stays; nothing is left in any namespace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns import NetHosts, need_netns

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
PERIOD_S = 0.3

CONTROLLER = """
import json, sys, time
from eagleeye.agents import AgentReport, AgentState, Membership, read_secret
members = Membership(read_secret(sys.argv[2]), sys.argv[1], period_s=float(sys.argv[3]))
print(json.dumps({"ready": members.address}), flush=True)
asked, deadline, lost = set(), time.time() + 60, []
while time.time() < deadline and not lost:
    for got in members.poll(timeout_s=0.05):
        if isinstance(got, AgentState):
            print(json.dumps({"admitted": got.agent, "host": got.host}), flush=True)
        elif isinstance(got, AgentReport):
            print(json.dumps({"report": got.agent, "kind": got.kind, **got.body}), flush=True)
    for agent in {s.agent for s in members.alive()} - asked:
        if len(members.alive()) == 2:
            asked.add(agent)
            members.send(agent, "restart", {"attempt": 1})
    lost = members.lost()
for gone in lost:
    print(json.dumps({"lost": gone.agent, "pings": gone.pings,
                      "alive": sorted(s.agent for s in members.alive())}), flush=True)
print(json.dumps({"refused": dict(members.refused)}), flush=True)
"""

AGENT = """
import sys, time
from eagleeye.agents import AgentLink, read_secret
controller, secret, name, rank, period = sys.argv[1:6]
link = AgentLink(controller, read_secret(secret), agent=name, node_rank=int(rank),
                 period_s=float(period)).start()
deadline = time.time() + 60
while time.time() < deadline:
    for message in link.take():
        link.report("outcome", {"action": message.kind, "status": "done"})
    time.sleep(0.05)
"""


def lines(proc: subprocess.Popen[str]) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the controller ended early"
    return dict(json.loads(line))


def test_agents_are_admitted_by_secret_act_on_control_and_a_lost_host_is_found(
    tmp_path: Path,
) -> None:
    need_netns()
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    (tmp_path / "wrong").write_text("fedcba9876543210fedcba9876543210\n")
    with NetHosts(3) as hosts:
        controller = hosts.popen(
            0,
            [sys.executable, "-c", CONTROLLER, f"tcp://{hosts.addresses[0]}:5702"]
            + [str(tmp_path / "secret"), str(PERIOD_S)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        address = lines(controller)["ready"]

        def agent(host: int, name: str, secret: str) -> None:
            argv = [address, str(tmp_path / secret), name, str(host - 1), str(PERIOD_S)]
            hosts.popen(host, [sys.executable, "-c", AGENT, *argv])

        agent(2, "forger", "wrong")  # on host B, before the real agents: never admitted
        agent(1, "a", "secret")
        agent(2, "b", "secret")
        seen = [lines(controller) for _ in range(4)]  # two admissions, two outcomes
        assert {s.get("admitted") for s in seen} - {None} == {"a", "b"}  # not the forger
        outcomes = {(s["report"], s["action"], s["status"]) for s in seen if "report" in s}
        assert outcomes == {("a", "restart", "done"), ("b", "restart", "done")}

        for pid in hosts.pids(2):  # host B is lost: every process on it dies
            subprocess.run(["kill", "-9", str(pid)], check=False)
        gone = lines(controller)
        assert gone["lost"] == "b"
        assert gone["pings"] >= 1  # the silence was answered with pings first
        assert gone["alive"] == ["a"]  # the healthy agent stays
        refused = lines(controller)["refused"]
        err = controller.communicate(timeout=30)[1]
        assert refused.get("auth", 0) >= 1  # the forger's hello and heartbeats
        assert "refused a message" in err
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in hosts.names)
