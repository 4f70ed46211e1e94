"""An agent runs the command line and environment the controller gives a rank only when
`eagleeye run --local-agents` started it (`--local`); any other agent runs its own command
line, its host's variables winning."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from eagleeye.agents.host import HostAgent

WRITE = "import os, sys; open(sys.argv[1], 'w').write(os.environ['PICKED'])"


class _Reports:
    """The agent's link as far as a start uses it: what it reports."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def report(self, kind: str, body: dict[str, Any]) -> None:
        self.sent.append((kind, body))

    def declare(self, node_rank: int | None = None, **declared: Any) -> None:
        """What the agent runs, said in a hello again: not a report."""


@pytest.mark.parametrize("local", [False, True])
def test_only_a_local_agent_runs_the_given_command_and_environment(
    tmp_path: Path, local: bool
) -> None:
    link = _Reports()
    own, given = tmp_path / "own.txt", tmp_path / "given.txt"
    agent = HostAgent(link, 0, ["-c", WRITE, str(own)], tmp_path / "logs")  # type: ignore[arg-type]
    agent.env = {"PICKED": "the agent's"}
    agent.local = local
    body = {
        "rank": 0, "node_rank": 0, "generation": 0, "nnodes": 1, "nproc_per_node": 1,
        "env": {"PICKED": "the controller's"}, "log": "attempt-0/rank-0.log",
        "argv": [sys.executable, "-c", WRITE, str(given)],
    }  # fmt: skip
    try:
        assert agent._start_rank(body) == "done"
        agent._ranks[0].proc.wait(timeout=30)
    finally:
        agent.stop_ranks([0], 0.0)
        agent._close()
    if local:
        assert not own.exists()
        assert given.read_text() == "the controller's"
    else:
        assert not given.exists()
        assert own.read_text() == "the agent's"
    assert link.sent[0][0] == "launched"
