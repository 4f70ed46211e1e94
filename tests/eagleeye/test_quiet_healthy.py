"""Healthy live runs are quiet: no finding on any preset of the reference workload, in job
and in replica mode, nor on the chaos suite's job without its faults, nor on the demo's
fault-free reference run. (The users' client scripts are checked for the same in
tests/eagleeye/test_clients_e2e.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from eagleeye.demo import WORKLOAD
from eagleeye.launch import JobConfig, run_job
from eagleeye.store import RunReader
from eagleeye.workload.model import PRESETS
from ft_runtime.layout import JobLayout
from tests.eagleeye.conftest import DemoRun
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _findings(run: Path) -> list[tuple[str, object, dict]]:
    with RunReader(run) as reader:
        table = reader.findings()
        assert reader.actions().empty
    return list(zip(table["kind"], table["rank"], table["evidence"], strict=True))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("recovery", ["job", "replica"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_healthy_run_of_every_preset_and_mode_draws_no_finding(
    tmp_path: Path, preset: str, recovery: str
) -> None:
    args = ["--preset", preset, "--steps", "40", "--batch-size", "2", "--block-size", "32"]
    config = JobConfig(
        script=WORKLOAD,
        module=True,
        script_args=[*args, "--checkpoint-every", "10"],
        layout=JobLayout(nnodes=2, nproc_per_node=2, replicas=2 if recovery == "replica" else 1),
        recovery=recovery,
        remediate=True,
        runs_dir=str(tmp_path),
        run_id=f"{preset}-{recovery}",
    )
    result = run_job(config)
    assert result.succeeded
    assert _findings(result.run_dir) == []


@pytest.mark.timeout(400)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("recovery", ["job", "replica"])
def test_the_chaos_suite_s_job_without_faults_draws_no_finding(
    tmp_path: Path, recovery: str, seed: int
) -> None:
    # The chaos harness's job (tests/eagleeye/chaos_harness.py): two nodes of one rank, the
    # tiny preset on 2 x 32 tokens for 100 steps. Its gradient norm jumps tenfold on a
    # hard batch now and then (clipped, the loss goes on): no gradient spike for that.
    if recovery == "replica":
        args = [*tiny_workload(100, 40), "--step-floor-s", "0.04"]
    else:
        args = tiny_workload(100, 10)
    config = JobConfig(
        script=WORKLOAD,
        module=True,
        script_args=[*args, "--seed", str(seed)],
        layout=JobLayout(nnodes=2, nproc_per_node=1, replicas=2 if recovery == "replica" else 1),
        recovery=recovery,
        remediate=True,
        runs_dir=str(tmp_path),
        run_id=f"chaos-{recovery}-{seed}",
    )
    result = run_job(config)
    assert result.succeeded
    assert _findings(result.run_dir) == []


@pytest.mark.timeout(420)
def test_the_demo_s_fault_free_reference_run_draws_no_finding(demo_run: DemoRun) -> None:
    # the reference run of `eagleeye demo --steps 90 --kill-step 10` (the demo's workload
    # and layout, no fault, no remediation), run once for the tests that read it
    # (tests/eagleeye/conftest.py)
    assert demo_run.returncode == 0, demo_run.output[-3000:]
    with RunReader(demo_run.reference) as reader:
        assert reader.meta()["result"]["succeeded"] is True
    assert _findings(demo_run.reference) == []
