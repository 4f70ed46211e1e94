"""`eagleeye run`'s local agents, the order their news is taken in: a local agent that
ends on its own (as the OOM killer would end it) takes its ranks with it, and a rank of
another agent that then dies of it (a collective's reset) is reported after that loss,
even when its agent's report came in before the loss was looked for. The first exit the
supervisor sees is the job's first failure: the other is collateral and draws no finding."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eagleeye.agents.local import LocalAgents
from ft_runtime.layout import JobLayout
from tests.eagleeye.procs import FAILS_ON_SIGUSR1, armed, ended

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(120)]


def _until(what: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


def test_a_rank_dead_of_a_lost_local_agent_is_seen_after_that_agents_loss(
    tmp_path: Path,
) -> None:
    layout = JobLayout(2, 1)
    (tmp_path / "logs" / "attempt-0").mkdir(parents=True)
    (tmp_path / "rank.py").write_text(FAILS_ON_SIGUSR1)
    with LocalAgents(tmp_path, layout, [str(tmp_path / "rank.py")], socket.gethostname()) as agents:
        argv = [sys.executable, str(tmp_path / "rank.py")]
        log = tmp_path / "logs" / "attempt-0"
        pids = [
            agents.start(spec, 0, argv, dict(os.environ), log / f"rank-{spec.rank}.log")
            for spec in layout.ranks()
        ]
        lost = agents.agents[f"{socket.gethostname()}-1"]
        lost.kill()  # node 1's agent ends, its rank with it
        lost.wait(timeout=30)
        _until(lambda: ended(pids[1]))
        armed(log / "rank-0.log")
        os.kill(pids[0], signal.SIGUSR1)  # rank 0 dies of it, after it
        _until(lambda: not Path(f"/proc/{pids[0]}").exists())  # reaped by its agent,
        time.sleep(1.0)  # which reports it: the report waits on the link, unread
        exits = agents.exits()  # the first look finds the agent gone, then its report
        deadline = time.monotonic() + 60  # a busy agent reports later: more looks
        while len(exits) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            exits += agents.exits()
    assert [(e.rank, e.code) for e in exits] == [(1, -signal.SIGKILL), (0, 1)]
