"""The replica coordinator across hosts answers a finding through its policy, except once
the job is stopping: then the finding is recorded and nothing is restarted into the stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.agents import Membership
from eagleeye.agents.membership import AgentState
from eagleeye.agents.replicas import ReplicaCoordinator
from eagleeye.store import RunReader, RunStore
from ft_runtime.errors import LaunchError
from ft_runtime.layout import JobLayout


def _exit(rank: int) -> Finding:
    subject = Subject(replica=rank, rank=rank, node=f"node{rank}")
    exit_code = {"exit_code": -9.0}
    return Finding("process_exit", subject, 1.0, Severity.CRITICAL, 0.0, None, exit_code)


def _answered(tmp_path: Path, stopping: bool) -> tuple[int, int]:
    """(findings, actions) in the store after one rank's exit is answered."""
    members = Membership(b"s" * 32, "tcp://127.0.0.1:0")
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run")
    try:
        coordinator = ReplicaCoordinator(members, JobLayout(2, 1, 2), store, "secret", dry_run=True)
        if stopping:
            coordinator.request_stop("SIGTERM")
        coordinator._answer(_exit(1))
    finally:
        store.close()
        members.close()
    with RunReader(tmp_path / "run") as reader:
        return len(reader.findings()), len(reader.actions())


def test_a_finding_is_answered_by_the_policy(tmp_path: Path) -> None:
    assert _answered(tmp_path, stopping=False) == (1, 1)  # a replica restart, decided


def test_a_finding_while_the_job_stops_is_recorded_not_answered(tmp_path: Path) -> None:
    assert _answered(tmp_path, stopping=True) == (1, 0)


def test_a_start_that_fails_ends_the_quorum_store_process_it_started(tmp_path: Path) -> None:
    """The store process outlives a controller killed outright; one whose start failed
    (its agent gone before the launch: nothing to go on with) leaves none behind."""
    members = Membership(b"s" * 32, "tcp://127.0.0.1:0")
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run")
    coordinator = ReplicaCoordinator(
        members, JobLayout(1, 1, 1), store, "0" * 32, log_dir=tmp_path / "replicas"
    )
    try:
        gone = AgentState("a0", "127.0.0.1", 0, b"a0", 0.0, 0.0)  # never connected
        coordinator._by_node[0] = gone
        with pytest.raises(LaunchError, match="is not connected"):
            coordinator._start()
        started = coordinator.quorum_store
        assert started is not None
        assert started.process is not None
        assert started.process.wait(timeout=10) == 0  # told to stop: no process left
    finally:
        if coordinator.quorum_store is not None and coordinator.quorum_store.alive:
            coordinator.quorum_store.close()
        store.close()
        members.close()
