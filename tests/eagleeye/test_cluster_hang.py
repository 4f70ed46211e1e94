"""A stopped rank of a job across hosts (loopback, two agents, a gloo all-reduce each
step): host B's agent sees its rank stopped, the controller finds the job waiting for it
and answers with one hang on that rank (its host named), and with ``--remediate`` the
job restarts on both agents and succeeds. No rank outlives the run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.test_cluster_cli import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]

#: a two-rank gloo loop with a hook, each step 50 ms of sleep then an all-reduce; the
#: loop's head, where a test adds what a step does before its all-reduce
LOOP_HEAD = """
import sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import eagleeye
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
ee = eagleeye.init()
for i in range(int(sys.argv[1])):
    ee.step_start(i)
    time.sleep(0.05)
"""
SYNCHRONOUS = (
    LOOP_HEAD
    + """    t = torch.ones(4)
    dist.all_reduce(t)
    ee.step_end(i, loss=float(t[0]))
ee.close()
dist.destroy_process_group()
"""
)


def test_a_stopped_rank_on_host_b_is_one_hang_and_the_job_restarts(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "120", script=SYNCHRONOUS, controller=("--remediate",))
    try:
        cluster.launched({0, 1}, 0)
        _until_step(tmp_path / "runs" / "r", 20)
        os.kill(cluster.by_rank[(0, 1)], signal.SIGSTOP)
        finding = cluster.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("hang", 1)
        assert finding["subject"]["node"] == "node1"
        assert finding["evidence"]["stopped_rank_1"] == 1.0
        cluster.launched({0, 1}, 1)
        assert cluster.ended()["phase"] == "succeeded"
        assert cluster.controller.wait(timeout=30) == 0
    finally:
        cluster.close()
    cluster.no_rank_left()
    with RunReader(tmp_path / "runs" / "r") as run:
        findings = run.query("SELECT kind, rank FROM findings ORDER BY id")
        actions = run.query("SELECT kind, target, status, dry_run FROM actions ORDER BY id")
    assert list(zip(findings["kind"], findings["rank"], strict=True)) == [("hang", 1)]
    assert list(actions.itertuples(index=False, name=None)) == [("restart", "job", "done", 0)]


def _until_step(run: Path, step: int) -> None:
    """Waits until the job's reduced telemetry reached ``step`` (both ranks stepping)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with RunReader(run) as reader:
            got = reader.query("SELECT max(step) AS s FROM samples WHERE rank IS NULL")
        if got["s"].notna().all() and int(got["s"].iloc[0]) >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach step {step}")
