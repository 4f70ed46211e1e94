"""The controller across hosts as the remediation policy's runtime (a real membership
socket and run store, no agents): a finding from outside on a host no agent runs on is
recorded with no decision; one placed on the job's node is decided, a dry run unless
remediation is enabled; the actions it cannot carry out across hosts are skipped with
the reason, and nothing acts while the job is not running."""

from __future__ import annotations

from pathlib import Path

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.agents import Membership
from eagleeye.agents.coordinator import JobCoordinator
from eagleeye.store import RunReader, RunStore, create_run_dir
from ft_runtime.layout import JobLayout
from ft_runtime.types import Action, ActionKind, OutcomeStatus

SECRET = b"0123456789abcdef0123456789abcdef"


def xid(node: str, rank: int | None = None) -> Finding:
    return Finding(
        "xid", Subject(rank=rank, node=node), 1.0, Severity.CRITICAL, 1.0, None, {}, "alert"
    )


def test_alerts_on_an_unknown_host_are_recorded_and_others_decided_as_a_dry_run(
    tmp_path: Path,
) -> None:
    inbox = [xid("host-z"), xid("node1", rank=1)]
    members = Membership(SECRET)
    store = RunStore(create_run_dir(tmp_path, "r"))
    try:
        coordinator = JobCoordinator(
            members, JobLayout(2, 1), store, inbox=lambda: [inbox.pop(0)] if inbox else []
        )
        assert coordinator.remediator.dry_run  # the built-in policy's default
        coordinator._poll()
        coordinator._poll()
    finally:
        store.close()
        members.close()
    with RunReader(tmp_path / "r") as run:
        findings = run.findings()
        actions = run.actions()
    assert list(findings["node"]) == ["host-z", "node1"]
    assert list(zip(actions["kind"], actions["target"], actions["dry_run"], strict=True)) == [
        ("evict", "node:node1", 1)
    ]


def test_actions_it_cannot_carry_out_across_hosts_are_skipped_with_the_reason(
    tmp_path: Path,
) -> None:
    members = Membership(SECRET)
    store = RunStore(create_run_dir(tmp_path, "r"))
    try:
        coordinator = JobCoordinator(members, JobLayout(2, 1), store, dry_run=False)
        rollback = coordinator.execute(Action(ActionKind.ROLLBACK, "job", "nan", "k1"))
        early = coordinator.execute(Action(ActionKind.RESTART, "job", "exit", "k2"))
        notice = coordinator.execute(Action(ActionKind.NOTIFY, "rank:1", "nan", "k3"))
    finally:
        store.close()
        members.close()
    assert rollback.status is OutcomeStatus.SKIPPED
    assert rollback.detail == "rollback is not supported across hosts (recovery job)"
    assert (early.status, early.detail) == (
        OutcomeStatus.SKIPPED,
        "the job is not running (pre_check)",
    )
    assert notice.status is OutcomeStatus.DONE
    assert coordinator.attempt == 0
