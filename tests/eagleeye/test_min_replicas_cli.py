"""`eagleeye run --min-replicas N` reaches the quorum: below N healthy replicas, the whole
job restarts from its newest checkpoint instead of waiting for one replica's catch-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]


def run_with_min_replicas(tmp_path: Path, minimum: int) -> RunReader:
    command = [sys.executable, "-m", "eagleeye", "run", "--nnodes", "2", "--replicas", "2"]
    command += ["--recovery", "replica", "--remediate", "--min-replicas", str(minimum)]
    command += ["--inject", "kill:rank=1@step=12", "--runs-dir", str(tmp_path)]
    command += ["--run-id", f"min{minimum}", "-m", "eagleeye.workload.train"]
    command += tiny_workload(steps=24, checkpoint_every=5)
    done = subprocess.run(command, capture_output=True, text=True, timeout=220, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return RunReader(tmp_path / f"min{minimum}")


def test_too_few_replicas_left_restart_the_job_from_the_cli(tmp_path: Path) -> None:
    with run_with_min_replicas(tmp_path, 2) as reader:
        config = reader.meta()["config"]
        events = reader.events()
    assert config["min_replicas"] == 2
    quorum = events[events["subject"] == "quorum"]["detail"]
    removals = [d["reason"] for d in quorum if "removed" in d]
    assert removals == ["rank 1 exited with -9"]  # the kill, not taken for a hang
    job = events[events["subject"] == "job"]
    recovering = job[job["phase"] == "recovering"]
    assert len(recovering) == 1  # the last resort, not a replica restart
    assert "fewer than the minimum of 2" in recovering["detail"].iloc[0]["reason"]
    succeeded = job[job["phase"] == "succeeded"]["detail"]
    assert [d["replicas"] for d in succeeded] == [[0, 1]]  # both trained to the end
