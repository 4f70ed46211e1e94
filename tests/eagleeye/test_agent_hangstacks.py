"""A hang's stacks across hosts on loopback, with real sockets and a real rank process:
the controller asks each agent of the job for its ranks' stacks and waits for them or its
deadline; an agent that does not answer costs the wait and nothing more (its ranks are
recorded without stacks, and why); an answer that breaks the schema is refused, one too
long is cut, a late one dropped; whatever else came meanwhile is handed back in order.
The store keeps each stack's host."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.agents import AgentLink, AgentReport, AgentState, Membership
from eagleeye.agents.hangstacks import STACKS, StackGather, StackRequest, answer
from eagleeye.stacks import HangStacks, find_py_spy
from eagleeye.store import RunReader, RunStore
from ft_runtime.layout import JobLayout
from tests.eagleeye.test_agents_wire import SECRET, wait_for

LAYOUT = JobLayout(nnodes=2, nproc_per_node=2)  # ranks 0, 1 on node 0; 2, 3 on node 1
RANK = """
import time
def asleep_here():
    time.sleep(120)
print("ready", flush=True)
asleep_here()
"""


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def cluster() -> Iterator[tuple[Membership, dict[int, AgentState], list[AgentLink]]]:
    """A membership and two admitted agents: ``a`` (node 0 on host-a), ``b`` (node 1)."""
    members = Membership(SECRET, period_s=0.2)
    links = [
        AgentLink(members.address, SECRET, agent=n, node_rank=i, period_s=0.2, host=f"host-{n}")
        for i, n in enumerate("ab")
    ]
    nodes: dict[int, AgentState] = {}
    try:
        for link in links:
            link.start()

        def admitted() -> bool:
            for got in members.poll(0.05):
                if isinstance(got, AgentState):
                    nodes[got.node_rank] = got
            return len(nodes) == 2

        wait_for(admitted)
        for link in links:
            wait_for(link.welcomed.is_set)
        yield members, nodes, links
    finally:
        for link in links:
            link.close()
        members.close()


def _answering(link: AgentLink, reply, stop: threading.Event) -> threading.Thread:
    """A thread that answers every stacks request ``link`` takes with ``reply(request)``
    (a list of answer bodies), as an agent does."""

    def serve() -> None:
        while not stop.is_set():
            for message in link.take():
                if message.kind == STACKS:
                    for body in reply(StackRequest.parse(message.body)):
                        link.report(STACKS, body)
            stop.wait(0.02)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_silent_agent_costs_the_wait_and_its_ranks_are_recorded_without_stacks(
    cluster, rank, tmp_path: Path
) -> None:
    members, nodes, (a, b) = cluster
    stop = threading.Event()
    # host-a's agent reads rank 0 (a real process) and says rank 1 is not running
    _answering(a, lambda req: answer(req, [0, 1], {0: rank.pid}, tmp_path, "host-a"), stop)
    b.report("outcome", {"action": "whatever", "status": "done"})  # b says something else
    try:
        got = StackGather(members, wait_s=6.0).gather(nodes, LAYOUT)
    finally:
        stop.set()
    stacks = {s.rank: s for s in got.stacks}
    assert sorted(stacks) == [0, 1, 2, 3]
    assert [stacks[r].host for r in range(4)] == ["host-a", "host-a", "host-b", "host-b"]
    assert stacks[0].pid == rank.pid
    if find_py_spy() is not None:  # read from outside, where it sleeps
        assert stacks[0].method == "py-spy"
        assert "asleep_here" in stacks[0].text
    assert stacks[1].method == "none"
    assert "rank 1 is not running on host-a" in stacks[1].text
    for silent in (2, 3):
        assert stacks[silent].method == "none"
        assert "the agent b of host-b did not answer within 6 s" in stacks[silent].text
    # what b said meanwhile is handed back, not lost
    assert [(r.agent, r.kind) for r in got.held if isinstance(r, AgentReport)] == [("b", "outcome")]
    # stored with the finding, each naming its host, as the console shows them
    store = RunStore(tmp_path)
    hang = Finding("hang", Subject(0, 3), 1.0, Severity.CRITICAL, 1.0, 12, {"idle": 1.0})
    finding_id = store.add_finding(hang)
    for s in got.stacks:
        store.add_stack(
            1.0, finding_id, s.rank, attempt=0, pid=s.pid, method=s.method, state=s.state,
            text=s.text, host=s.host,
        )  # fmt: skip
    store.close()
    with RunReader(tmp_path) as reader:
        rows = reader.stacks(finding_id)
    assert list(rows["host"]) == ["host-a", "host-a", "host-b", "host-b"]
    assert list(rows["text"]) == [stacks[r].text for r in range(4)]
    shown = HangStacks(hang, got.stacks).to_json()["stacks"]
    assert [(s["rank"], s["host"]) for s in shown] == [(r, stacks[r].host) for r in range(4)]


def test_answers_that_break_the_schema_are_refused_long_ones_cut_late_ones_dropped(
    cluster,
) -> None:
    members, nodes, (a, b) = cluster
    stop = threading.Event()
    long_text = "Thread 1\n" + "x" * 5000

    def broken(req: StackRequest) -> list[dict]:
        good = {"request": req.request, "pid": 7, "method": "py-spy", "state": "S"}
        return [
            {**good, "request": req.request - 1, "rank": 0, "text": "an old request's"},
            {**good, "rank": 2, "text": "node 1's rank, from node 0's agent"},
            {**good, "rank": 0, "method": "evil", "text": "t"},
            {**good, "rank": 0, "text": "a second answer is ignored"},
            {**good, "rank": 1, "text": long_text},
        ]

    def fine(req: StackRequest) -> list[dict]:
        good = {"request": req.request, "pid": 9, "method": "faulthandler", "text": "Thread 2"}
        return [{**good, "rank": 2, "state": "S"}, {**good, "rank": 3, "state": "TOO"}]

    _answering(a, broken, stop)
    _answering(b, fine, stop)
    try:
        gather = StackGather(members, wait_s=6.0, max_chars=1000)
        gather.gather(nodes, LAYOUT)  # a first hang: its answers are old for the second
        got = gather.gather(nodes, LAYOUT)
    finally:
        stop.set()
    stacks = {s.rank: s for s in got.stacks}
    assert sorted(stacks) == [0, 1, 2, 3]
    assert stacks[0].method == "none"
    assert "refused: method must be one of" in stacks[0].text
    assert stacks[1].method == "py-spy"
    assert len(stacks[1].text) <= 1000
    assert stacks[1].text.startswith("Thread 1\nxxx")
    assert stacks[1].text.endswith("[truncated: 5009 characters, 960 kept]")
    assert (stacks[2].method, stacks[2].pid, stacks[2].host, stacks[2].text) == (
        "faulthandler",
        9,
        "host-b",
        "Thread 2",
    )
    assert stacks[3].method == "none"
    assert "refused: state must be one printable character" in stacks[3].text


def test_a_lost_agent_is_not_waited_for(cluster) -> None:
    members, nodes, _ = cluster
    nodes[0].lost_at = nodes[1].lost_at = 1.0
    got = StackGather(members, wait_s=60.0).gather(nodes, LAYOUT)  # returns at once
    assert [s.method for s in got.stacks] == ["none"] * 4
    assert got.stacks[0].text == "no stacks: the agent a of host-a is lost"


def test_a_wait_of_zero_asks_no_agent(cluster) -> None:
    members, nodes, _ = cluster
    got = StackGather(members, wait_s=0.0).gather(nodes, LAYOUT)
    assert [(s.rank, s.host, s.method) for s in got.stacks] == [
        (0, "host-a", "none"),
        (1, "host-a", "none"),
        (2, "host-b", "none"),
        (3, "host-b", "none"),
    ]
    assert "not asked for" in got.stacks[0].text


@pytest.mark.parametrize(
    "body",
    [
        {"request": True, "timeout_s": 1.0, "max_chars": 2000},
        {"request": -1, "timeout_s": 1.0, "max_chars": 2000},
        {"request": 1, "timeout_s": float("nan"), "max_chars": 2000},
        {"request": 1, "timeout_s": float("inf"), "max_chars": 2000},
        {"request": 1, "timeout_s": 0, "max_chars": 2000},
        {"request": 1, "timeout_s": 3600, "max_chars": 2000},
        {"request": 1, "timeout_s": "1", "max_chars": 2000},
        {"request": 1, "timeout_s": 1.0, "max_chars": 10},
        {"request": 1, "timeout_s": 1.0, "max_chars": 10**9},
        {"request": 1, "timeout_s": 1.0},
    ],
)
def test_an_agent_refuses_a_request_that_breaks_the_schema(body: dict) -> None:
    with pytest.raises(ValueError, match="request|timeout_s|max_chars"):
        StackRequest.parse(body)


def test_a_valid_request_is_taken_as_it_is() -> None:
    request = StackRequest.parse({"request": 3, "timeout_s": 2, "max_chars": 4000})
    assert (request.request, request.timeout_s, request.max_chars) == (3, 2.0, 4000)
    assert StackRequest.parse(request.body()) == request


def test_a_stack_of_one_machine_names_no_host(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.add_stack(1.0, None, 0, attempt=0, pid=1, method="none", state="T", text="no stacks")
    store.close()
    with RunReader(tmp_path) as reader:
        row = reader.stacks().iloc[0]
    assert (row["host"], row["text"]) == ("", "no stacks")
