from __future__ import annotations

from pathlib import Path

import pytest

from eagleeye.launch import JobConfig, run_job
from ft_runtime.layout import JobLayout
from tests.workload_args import tiny_workload


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory) -> Path:
    """A real run of the reference workload: 2 replicas of 2 ranks, one killed, recovered."""
    runs = tmp_path_factory.mktemp("runs")
    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=tiny_workload(24, 6),
        layout=JobLayout(2, 2, 2),
        remediate=True,
        inject=("kill:rank=3@step=10",),
        runs_dir=str(runs),
        run_id="recorded",
    )
    result = run_job(config)
    assert result.succeeded
    return result.run_dir
