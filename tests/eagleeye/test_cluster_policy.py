"""The controller across hosts as the remediation policy's runtime (a real membership
socket and run store, no agents): a finding from outside on a host no agent runs on is
recorded with no decision; one placed on the job's node is decided, a dry run unless
remediation is enabled; the actions it cannot carry out across hosts are skipped with
the reason, and nothing acts while the job is not running. Bad flags (a webhook without
its token, a policy file missing, a busy port) are one-line errors before anything is
bound or made."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.agents import Membership
from eagleeye.agents.coordinator import JobCoordinator
from eagleeye.store import RunReader, RunStore, create_run_dir
from ft_runtime.layout import JobLayout
from ft_runtime.ports import free_port
from ft_runtime.types import Action, ActionKind, OutcomeStatus

REPO = Path(__file__).resolve().parents[2]
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


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--webhook", "127.0.0.1:0"], "--webhook needs --webhook-token-file"),
        (["--webhook", "127.0.0.1:0", "--webhook-token-file", "missing"], "token file missing"),
        (["--policy", "missing.toml"], "cannot read policy file missing.toml"),
        (["--metrics-port", "BUSY"], "cannot serve metrics on 127.0.0.1:BUSY"),
        (["--webhook", "127.0.0.1:BUSY", "--webhook-token-file", "token"], "alert webhook"),
    ],
)
def test_bad_flags_are_one_line_errors_before_anything_is_made(
    tmp_path: Path, flags: list[str], says: str
) -> None:
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "token").write_text("alert-token\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        argv = [sys.executable, "-m", "eagleeye", "controller", "--secret-file", "secret"]
        argv += ["--nnodes", "2", "--listen", f"127.0.0.1:{free_port()}"]
        argv += [flag.replace("BUSY", port) for flag in flags]
        env = {**os.environ, "PYTHONPATH": str(REPO)}  # this tree's eagleeye from tmp_path
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert says.replace("BUSY", port) in done.stderr
    assert not (tmp_path / "runs").exists()
