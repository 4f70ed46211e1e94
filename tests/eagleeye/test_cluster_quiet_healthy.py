"""Healthy jobs across hosts are quiet (`eagleeye controller --remediate` and one `eagleeye
agent` per host, on loopback): each agent judges its own ranks' full series and the
controller compares the hosts, and neither names anything on a healthy job, whether the
script reports through the hooks (the reference workload) or has no Eagle Eye code in it
(tests/clients/ddp_train.py: each agent starts its ranks through the zero-code telemetry).
Its one attempt succeeds; no finding, no action; every rank's steps reach the controller."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.test_clients_e2e import CLIENTS
from tests.eagleeye.test_cluster_cli import Cluster
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


def _quiet_across_hosts(tmp_path: Path, steps: int, *program: str) -> None:
    cluster = Cluster(tmp_path, "", nproc=2, controller=("--remediate",), program=program)
    try:
        end, findings = cluster.findings_to_the_end()
        assert end["phase"] == "succeeded", cluster.said()
        assert findings == []
        assert [a.wait(timeout=60) for a in cluster.agents] == [0, 0]
    finally:
        cluster.close()
    cluster.no_rank_left()
    with RunReader(tmp_path / "runs" / "r") as run:
        assert run.findings().empty, run.findings()
        assert run.actions().empty, run.actions()
        assert run.meta()["result"]["attempts"] == 1
        reporting = run.samples(names=["ranks_reporting"])["value"]
    # every rank's steps were watched, through the hook or the zero-code telemetry
    assert (reporting == 4).sum() >= 0.9 * steps, reporting.value_counts()


def test_the_reference_workload_across_two_hosts_draws_no_finding(tmp_path: Path) -> None:
    _quiet_across_hosts(tmp_path, 100, "-m", "eagleeye.workload.train", *tiny_workload(100, 25))


def test_a_users_ddp_script_across_two_hosts_draws_no_finding(tmp_path: Path) -> None:
    # its evaluations and rank 0's torch.save every 20 iterations pause the loop
    args = ["--max_iters", "80", "--eval_interval", "20", "--out_dir", str(tmp_path / "out")]
    _quiet_across_hosts(tmp_path, 80, str(CLIENTS / "ddp_train.py"), *args)
