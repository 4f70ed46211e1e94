"""SIGTERM to `eagleeye controller --recovery replica --replicas 2` or to one of its agents
mid-run (loopback, an agent for each replica's host, a script whose manager saves on the
controller's ``checkpoint`` command). With ``--grace-period`` the replicas are asked for
a checkpoint first: the source replica saves one step to disk, the store records it (the
command's outcome, the checkpoint, then the stop with its cause), and only then every
rank ends. Without a grace period the job ends at once and no checkpoint is asked for.
Either way the controller exits 1, as in job recovery, the agents 0, and no rank outlives
the run."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.cluster_replica_helpers import SAVING, steps
from tests.eagleeye.test_cluster_replicas import Job

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


GRACE = ("--grace-period", "10")


def stopped(job: Job, proc: subprocess.Popen[str], cause: str) -> None:
    """SIGTERM to ``proc`` (the controller or an agent): the job fails as stopped by
    ``cause``, the controller exits 1, every agent 0, and no rank is left."""
    proc.send_signal(signal.SIGTERM)
    end = job.lines.next(lambda i: i.get("subject") == "job" and i.get("phase") != "running")
    assert end["phase"] == "failed"
    assert end["detail"]["reason"].startswith(f"stopped by {cause}")
    assert job.controller.wait(timeout=60) == 1
    assert [agent.wait(timeout=60) for agent in job.agents] == [0, 0]


def checkpointed_then_stopped(job: Job, cause: str) -> None:
    """The store: the checkpoint command sent and answered (done), one checkpoint at one
    step, saved on disk where the script saves it by replica 0's rank, between the
    request and the stop (with its cause); no rank is left."""
    job.no_rank_left(job.first[0]["pid"], job.first[1]["pid"])
    with RunReader(job.tmp / "runs" / "r") as run:
        actions = run.actions()
        saved = run.checkpoints()
        events = run.events()
    asked = actions[actions["kind"] == "checkpoint"]
    assert list(asked["target"]) == ["job", "job"]
    assert list(asked["status"]) == ["pending", "done"]  # sent, then answered
    assert list(saved["step"]) == [int(saved["step"][0])]  # one checkpoint, at one step
    step, path = int(saved["step"][0]), Path(saved["path"][0])
    assert f"saved step {step} to {path}" in asked["detail"].iloc[1]
    assert path == job.tmp / "saved" / f"step-{step}.pt"  # where the script saves it
    assert sorted((job.tmp / "saved").iterdir()) == [path]
    assert step in steps(job.healthy)  # a step replica 0 committed
    assert f"saved step {step}" in job.healthy.read_text()  # by the rank, before it ended
    job_events = [
        (dict(e["detail"]), e["time"]) for _, e in events.iterrows() if e["subject"] == "job"
    ]
    requested = [t for d, t in job_events if "checkpoint_requested" in d]
    why = f"stopped by {cause}"
    ended = [t for d, t in job_events if d.get("stopped") and d["reason"].startswith(why)]
    assert len(requested) == 1
    assert len(ended) == 1
    assert requested[0] <= saved["time"][0] <= ended[0]  # asked, saved, then the stop


def test_sigterm_with_a_grace_period_checkpoints_one_step_then_ends_every_rank(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, controller=("--remediate", *GRACE), script=SAVING)
    try:
        job.start(spare=False)
        stopped(job, job.controller, "SIGTERM")
    finally:
        job.close()
    checkpointed_then_stopped(job, "SIGTERM")


def test_sigterm_to_an_agent_with_a_grace_period_checkpoints_then_stops_every_host(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, controller=("--remediate", *GRACE), script=SAVING)
    try:
        job.start(spare=False, host_b=GRACE)
        stopped(job, job.agents[1], "SIGTERM to the agent")
    finally:
        job.close()
    checkpointed_then_stopped(job, "SIGTERM to the agent")


def test_sigterm_without_a_grace_period_ends_at_once_and_asks_no_checkpoint(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, script=SAVING)
    try:
        job.start(spare=False)
        stopped(job, job.controller, "SIGTERM")
    finally:
        job.close()
    job.no_rank_left(job.first[0]["pid"], job.first[1]["pid"])
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.actions()
        saved = run.checkpoints()
        events = run.events()
    assert "checkpoint" not in set(actions["kind"])
    assert saved.empty
    assert not (tmp_path / "saved").exists()
    details = [dict(e["detail"]) for _, e in events.iterrows() if e["subject"] == "job"]
    assert not any("checkpoint_requested" in d for d in details)
    assert {"reason": "stopped by SIGTERM", "stopped": True} in details
