"""The launcher of replicas across hosts: what it sends to the agents and how their
reports and a lost host become the exits a ``ReplicaSupervisor`` reads."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path

import pytest

from eagleeye.agents.agentlauncher import STOPPED_LOOK, UNSEEN, AgentLauncher
from ft_runtime.errors import LaunchError
from ft_runtime.layout import JobLayout


class Sent:
    """Records what would go to each agent; ``down`` agents are not connected."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, dict[str, object]]] = []
        self.down: set[str] = set()

    def send(self, agent: str, kind: str, body: Mapping[str, object]) -> bool:
        if agent in self.down:
            return False
        self.messages.append((agent, kind, dict(body)))
        return True


LAYOUT = JobLayout(nnodes=2, nproc_per_node=2, replicas=2)  # replica r on node rank r


def started() -> tuple[AgentLauncher, Sent]:
    sent = Sent()
    launcher = AgentLauncher(sent, LAYOUT, clock=lambda: 7.0)
    launcher.place(0, "a")
    launcher.place(1, "b")
    for spec in LAYOUT.ranks():
        launcher.start(spec, 0, ["python", "x.py"], {"RANK": str(spec.rank)}, Path("r/rank.log"))
    return launcher, sent


def test_a_start_goes_to_the_agent_of_its_node_rank_with_its_environment() -> None:
    launcher, sent = started()
    assert [(a, k, b["rank"]) for a, k, b in sent.messages] == [
        ("a", "start_rank", 0),
        ("a", "start_rank", 1),
        ("b", "start_rank", 2),
        ("b", "start_rank", 3),
    ]
    body = sent.messages[2][2]
    assert body["env"] == {"RANK": "2"}
    assert (body["node_rank"], body["generation"], body["replicas"]) == (1, 0, 2)
    assert body["log"] == "r/rank.log"  # names only: the agent puts it under its log folder
    assert all(launcher.running(r) for r in range(4))
    assert launcher.sample(2) == UNSEEN  # a live rank elsewhere: taken as running
    assert launcher.pid(2) is None  # until the agent reports it
    assert launcher.launched("b", 2, 4242, 0)
    assert launcher.pid(2) == 4242
    assert not launcher.launched("a", 2, 1, 0)  # not where the rank runs


def test_a_lost_host_ends_every_rank_it_ran_and_nothing_more_is_sent_to_it() -> None:
    launcher, sent = started()
    assert launcher.exited("a", 0, 1, 0)
    assert launcher.host_lost("b") == [2, 3]
    exits = launcher.exits()
    assert [(e.rank, e.generation, e.code, e.time) for e in exits] == [
        (0, 0, 1, 7.0),
        (2, 0, -signal.SIGKILL, 7.0),
        (3, 0, -signal.SIGKILL, 7.0),
    ]
    assert launcher.exits() == []  # each exit once
    assert not launcher.running(2)
    assert launcher.sample(2) is None
    assert not launcher.exited("b", 2, 0, 0)  # a late report of the lost host: counted already
    before = len(sent.messages)
    launcher.signal(2, signal.SIGKILL)
    launcher.stop([2, 3], 0.0)
    assert len(sent.messages) == before
    spec = LAYOUT.rank(2)
    with pytest.raises(LaunchError, match="no agent holds node rank 1"):
        launcher.start(spec, 1, [], {}, Path("r/rank.log"))
    launcher.place(1, "spare")  # a spare takes the node rank: its replica restarts there
    launcher.start(spec, 1, [], {}, Path("r/rank.log"))
    assert sent.messages[-1][:2] == ("spare", "start_rank")
    assert launcher.running(2)
    assert not launcher.exited("b", 2, 0, 1)  # the old host has no say on the new process


def test_stop_asks_each_agent_for_its_ranks_and_counts_them_ended_at_once() -> None:
    launcher, sent = started()
    launcher.stop([1, 2, 3], 5.0)
    assert sent.messages[-2:] == [
        ("a", "stop_ranks", {"ranks": [1], "grace_s": 5.0}),
        ("b", "stop_ranks", {"ranks": [2, 3], "grace_s": 5.0}),
    ]
    assert [e.rank for e in launcher.exits()] == [1, 2, 3]
    assert [launcher.running(r) for r in range(4)] == [True, False, False, False]
    launcher.signal(0, signal.SIGTERM)
    assert sent.messages[-1] == ("a", "signal", {"rank": 0, "sig": int(signal.SIGTERM)})


def test_an_agent_not_connected_fails_the_start() -> None:
    sent = Sent()
    sent.down.add("a")
    launcher = AgentLauncher(sent, LAYOUT)
    launcher.place(0, "a")
    with pytest.raises(LaunchError, match="not connected"):
        launcher.start(LAYOUT.rank(0), 0, [], {}, Path("r/rank.log"))
    assert not launcher.running(0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--recovery", "replica", "--snapshots"], "--recovery replica does not take --snapshots"),
        (["--replicas", "2"], "--replicas needs --recovery replica"),
        (["--recovery", "replica", "--replicas", "3"], "cannot be split into 3 equal replicas"),
    ],
)
def test_the_controller_refuses_what_replica_recovery_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    from eagleeye.cli import main

    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    argv = ["controller", "--nnodes", "2", "--secret-file", str(tmp_path / "secret")]
    assert main([*argv, "--runs-dir", str(tmp_path / "runs"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before a run folder is made


def test_a_rank_its_agent_found_stopped_is_seen_stopped_until_it_runs_or_restarts() -> None:
    launcher, _ = started()
    assert not launcher.stopped("a", 2, 0, True)  # rank 2 runs on b, not a
    assert not launcher.stopped("b", 2, 1, True)  # not its current process
    assert launcher.sample(2) == UNSEEN
    assert launcher.stopped("b", 2, 0, True)
    assert launcher.sample(2) == STOPPED_LOOK
    assert launcher.sample(3) == UNSEEN
    assert launcher.stopped("b", 2, 0, False)  # running again
    assert launcher.sample(2) == UNSEEN
    launcher.stopped("b", 2, 0, True)
    launcher.stop([2], 1.0)
    assert launcher.sample(2) is None  # ended: no look at all
    launcher.start(LAYOUT.rank(2), 1, ["python", "x.py"], {}, Path("r/rank.log"))
    assert launcher.sample(2) == UNSEEN  # its new process was never seen stopped
