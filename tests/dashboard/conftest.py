from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagleeye.launch import JobConfig, run_job
from eagleeye.store import RunReader
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


@pytest.fixture(scope="session")
def hung_run(tmp_path_factory) -> Iterator[Path]:
    """A live `eagleeye run` of 4 ranks on 2 nodes whose rank 1 is stopped at step 8 and
    never remediated: the job stays hung while the test looks at it."""
    runs = tmp_path_factory.mktemp("live")
    command = [
        *(sys.executable, "-m", "eagleeye", "run", "--nnodes", "2", "--nproc-per-node", "2"),
        *("--inject", "stop:rank=1@step=8", "--runs-dir", str(runs), "--run-id", "hung"),
        *("-m", "eagleeye.workload.train", "--", *tiny_workload(400, 6)),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = runs / "hung"
    try:
        _wait_for_hang(run, process, timeout_s=90.0)
        yield run
    finally:
        ranks = _children(process.pid)
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        for pid in ranks:  # the stopped rank outlives its controller unless killed
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_for_hang(run: Path, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the live run ended early with exit code {process.returncode}")
        if (run / "run.db").exists():
            with RunReader(run) as reader:
                found = reader.query("SELECT count(*) AS n FROM findings WHERE kind = 'hang'")
                progress = reader.meta().get("progress") or {}
            # the controller writes the ranks' progress each second, the finding at once
            if int(found["n"].iloc[0]) and "stopped" in progress.values():
                return
        time.sleep(0.5)
    raise AssertionError(f"no hang finding in {run} within {timeout_s} s")


def _children(pid: int) -> list[int]:
    """The process's children (its ranks), read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found
