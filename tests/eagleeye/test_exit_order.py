"""Which rank ended first, when several end together: a rank killed takes its peers down a
moment later (their collective resets). An agent that sees both in one look reports them
in the order the processes ended, with how long ago each ended; the controller takes the
exits of one poll in that order, so the killed rank is the job's first failure and its
peers are collateral, whatever their rank numbers or the order their reports arrived in."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

from eagleeye.agents.host import HostAgent
from eagleeye.agents.membership import AgentReport, AgentState, ended_ago_s, first_ended_first
from tests.eagleeye.procs import FAILS_ON_SIGUSR1, armed
from tests.eagleeye.test_local_agent_start import _Reports


def _reaped(agent: HostAgent, rank: int) -> None:
    deadline = time.monotonic() + 30
    while agent._ranks[rank].ended_at is None:
        assert time.monotonic() < deadline, f"rank {rank} did not end"
        time.sleep(0.01)


def test_exits_seen_in_one_look_are_reported_in_the_order_they_happened(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(FAILS_ON_SIGUSR1)
    link = _Reports()
    agent = HostAgent(link, 0, [str(tmp_path / "rank.py")], tmp_path / "logs")  # type: ignore[arg-type]
    try:
        for rank in (0, 1):
            body = {
                "rank": rank, "node_rank": 0, "generation": 0, "nnodes": 1,
                "nproc_per_node": 2, "env": {}, "log": f"attempt-0/rank-{rank}.log",
                "argv": [sys.executable, str(tmp_path / "rank.py")],
            }  # fmt: skip
            assert agent._start_rank(body) == "done"
        for rank in (0, 1):
            armed(tmp_path / "logs" / "attempt-0" / f"rank-{rank}.log")
        os.kill(agent._ranks[1].proc.pid, signal.SIGKILL)  # rank 1 lost first
        _reaped(agent, 1)
        time.sleep(0.1)
        os.kill(agent._ranks[0].proc.pid, signal.SIGUSR1)  # rank 0 fails of it, after
        _reaped(agent, 0)
        agent._watch()  # one look finds both ended
    finally:
        agent.stop_ranks([0, 1], 0.0)
        agent._close()
    exits = [body for kind, body in link.sent if kind == "exit"]
    assert [(e["rank"], e["code"]) for e in exits] == [(1, -signal.SIGKILL), (0, 1)]
    assert exits[0]["ended_s_ago"] >= exits[1]["ended_s_ago"] + 0.05


def _exit(agent: str, rank: int, ago: object) -> AgentReport:
    return AgentReport(
        agent, "exit", {"rank": rank, "code": 1, "attempt": 0, "ended_s_ago": ago}, 0.0
    )


def test_a_poll_takes_its_exits_first_ended_first_and_leaves_the_rest_in_place() -> None:
    joined = AgentState("c", "host-c", 2, b"c", 0.0, 0.0)
    launched = AgentReport("a", "launched", {"rank": 5, "pid": 1, "attempt": 1}, 0.0)
    items: list[AgentState | AgentReport] = [
        _exit("a", 0, 0.01), launched, joined, _exit("b", 3, 0.3), _exit("a", 1, 0.2)
    ]  # fmt: skip
    ordered = first_ended_first(items)
    assert ordered[1] is launched
    assert ordered[2] is joined
    exits = [ordered[i] for i in (0, 3, 4)]
    assert [(x.agent, x.body["rank"]) for x in exits] == [("b", 3), ("a", 1), ("a", 0)]


def test_an_age_that_is_not_a_sane_number_counts_as_none() -> None:
    for bad in ("0.5", None, True, math.nan, math.inf, -3.0, [1]):
        assert ended_ago_s({"ended_s_ago": bad}) == 0.0, bad
    assert ended_ago_s({}) == 0.0  # an agent from before the field
    assert ended_ago_s({"ended_s_ago": 1e9}) == 60.0
    assert ended_ago_s({"ended_s_ago": 2}) == 2.0
