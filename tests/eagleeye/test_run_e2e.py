"""`eagleeye run` end to end: real ranks, a real kill or stop, detection and recovery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eagleeye.launch import JobConfig, run_job
from eagleeye.store import RunReader, newest_run
from ft_runtime.layout import JobLayout
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
WORKLOAD = tiny_workload(20, 5)


def eagleeye_run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "eagleeye",
            "run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--replicas",
            "2",
            "--runs-dir",
            str(tmp_path),
            *flags,
            "-m",
            "eagleeye.workload.train",
            "--",
            *WORKLOAD,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_killed_rank_is_detected_and_the_job_restarts_from_its_checkpoint(tmp_path) -> None:
    result = eagleeye_run(tmp_path, "--remediate", "--inject", "kill:rank=1@step=8")
    assert result.returncode == 0, result.stderr
    reader = RunReader(newest_run(tmp_path))
    fault = reader.faults().iloc[0]
    assert (fault["kind"], fault["rank"], fault["step"]) == ("kill", 1, 8)
    finding = reader.findings().iloc[0]
    assert (finding["kind"], finding["rank"]) == ("process_exit", 1)
    assert finding["evidence"]["signal"] == 9
    assert finding["time"] - fault["time"] < 2.0
    action = reader.actions().iloc[0]
    assert (action["kind"], action["target"], action["status"]) == ("restart", "job", "done")
    assert action["finding_id"] == finding["id"]
    events = reader.events()
    job = events[events["subject"] == "job"]
    assert list(job["phase"]) == ["launch", "recovering", "launch", "succeeded"]
    steps = reader.samples(names=["step_time"])
    resumed = steps[steps["attempt"] == 1]
    assert resumed["step"].min() == 5  # the checkpoint after step 4
    assert resumed["step"].max() == 19
    assert set(steps["rank"]) == {0, 1}
    sections = set(reader.samples()["name"])
    assert {"section.forward", "section.backward", "section.allreduce", "loss"} <= sections
    collectives = reader.collectives()
    # The gradient all-reduce and the checkpoint barrier, timed without code in the script.
    assert set(collectives["op"]) == {"all_reduce", "barrier"}
    first = collectives[(collectives["rank"] == 0) & (collectives["attempt"] == 0)]
    assert list(first["seq"]) == list(range(len(first)))
    assert (collectives["exit_time"] >= collectives["enter_time"]).all()
    assert "PERSISTENT" in set(reader.checkpoints()["state"])
    assert "finding process_exit on rank 1" in " ".join(result.stderr.split())


def test_without_remediate_the_action_is_dry_run_and_the_job_fails(tmp_path) -> None:
    result = eagleeye_run(tmp_path, "--inject", "kill:rank=0@step=6")
    assert result.returncode == 1
    reader = RunReader(newest_run(tmp_path))
    action = reader.actions().iloc[0]
    assert action["status"] == "skipped"
    assert action["dry_run"] == 1
    assert "dry-run" in action["detail"]
    phases = list(reader.events().query("subject == 'job'")["phase"])
    assert phases == ["launch", "failed"]


def test_a_stopped_rank_is_found_hung_and_the_job_recovers(tmp_path) -> None:
    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=WORKLOAD,
        layout=JobLayout(1, 2, 2),
        remediate=True,
        inject=("stop:rank=1@step=7",),
        runs_dir=str(tmp_path),
    )
    result = run_job(config)
    assert result.succeeded
    findings = RunReader(result.run_dir).findings()
    hung = findings[findings["kind"] == "hang"]
    # Rank 0 went silent as early as rank 1, waiting for it in the all-reduce; the finding
    # names rank 1, the one /proc shows stopped, with rank 0 waiting in its evidence.
    assert list(hung["rank"]) == [1]
    evidence = hung.iloc[0]["evidence"]
    assert evidence["stopped"] == 1.0
    assert evidence["stopped_s"] >= evidence["limit_s"] >= 0.25
    assert evidence["waiting_rank_0"] == 0.0
    actions = RunReader(result.run_dir).actions()
    assert actions.iloc[0]["status"] == "done"
    # One restart answers the incident, however many ranks went silent with it: findings
    # made before that restart finished get no restart of their own.
    incident = findings[findings["time"] <= actions.iloc[0]["outcome_time"]]
    assert len(actions[actions["finding_id"].isin(incident["id"])]) == 1
