"""SIGTERM to node rank 1's `eagleeye agent` under `eagleeye controller --recovery replica
--replicas 2` while a spare waits (loopback, the real commands): its host is drained as a
lost one is replaced: only replica 1 restarts, on the spare, and catches up from replica
0, whose rank keeps its pid and steps on; no finding, one `evict` action with the reason;
the job succeeds, the leaving agent ends on its signal and no rank outlives the run."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.cluster_replica_helpers import steps
from tests.eagleeye.test_cluster_replicas import Job

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


def test_sigterm_to_an_agent_with_a_spare_restarts_only_its_replica_there(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    try:
        job.start()  # agents: the spare, node rank 0, node rank 1
        job.agents[2].send_signal(signal.SIGTERM)
        at_loss = steps(job.healthy)[-1]
        moved = job.caught_up(at_loss)
        assert moved["agent"].endswith("-spare")
        assert job.agents[2].wait(timeout=60) == 1  # it left on the signal (no grace period)
        assert [proc.wait(timeout=60) for proc in job.agents[:2]] == [0, 0]
    finally:
        job.close()
    detail = job.moved_to_spare(at_loss, moved, [])
    assert "node rank 1 moved to the spare" in detail
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.actions()
    evicts = actions[actions["kind"] == "evict"]
    assert "left on SIGTERM" in str(evicts["reason"].iloc[0])
    assert evicts["finding_id"].isna().all()  # a signal, no finding
