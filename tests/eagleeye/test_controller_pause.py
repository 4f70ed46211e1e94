"""A paused controller or quorum store (SIGSTOP, a swap storm, a slow disk) judges nothing
on what it missed: after it runs again, a healthy job is not declared hung, in job and
replica mode."""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import pytest

from eagleeye.store import RunReader, newest_run
from tests.eagleeye.test_clients_e2e import CLIENTS, spawn_eagleeye
from tests.eagleeye.test_clients_faults_e2e import _rank_pids
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _paused_run(
    tmp_path, *args: str, pause: str = "controller"
) -> subprocess.CompletedProcess[str]:
    runs = str(tmp_path / "runs")
    job = spawn_eagleeye(
        tmp_path, "run", "--remediate", "--stream", "none", "--runs-dir", runs, *args
    )
    _rank_pids(tmp_path, wait_for_step=5)
    paused = psutil.Process(job.pid)
    if pause == "store":
        (paused,) = [p for p in paused.children() if "ft_runtime.storehost" in p.cmdline()]
    paused.send_signal(signal.SIGSTOP)
    time.sleep(6.0)
    paused.send_signal(signal.SIGCONT)
    out, err = job.communicate(timeout=240)
    return subprocess.CompletedProcess(job.args, job.returncode, out, err)


def _quiet(tmp_path) -> None:
    with RunReader(newest_run(tmp_path / "runs")) as reader:
        findings, actions = reader.findings(), reader.actions()
        assert reader.meta()["result"]["attempts"] == 1
    hangs = findings[findings["kind"] == "hang"]
    assert hangs.empty, hangs
    assert actions.empty, actions


@pytest.mark.timeout(300)
def test_a_controller_paused_6_s_restarts_nothing_in_job_mode(tmp_path) -> None:
    result = _paused_run(
        tmp_path,
        *("--nproc-per-node", "2", str(CLIENTS / "ddp_train.py")),
        *("--max_iters", "300", "--eval_interval", "1000", "--out_dir", "out"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _quiet(tmp_path)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pause", ["controller", "store"])
def test_a_controller_or_store_paused_6_s_isolates_no_replica(tmp_path, pause) -> None:
    result = _paused_run(
        tmp_path,
        *("--nnodes", "2", "--nproc-per-node", "1", "--replicas", "2", "--recovery", "replica"),
        *("-m", "eagleeye.workload.train", *tiny_workload(300, 100), "--step-floor-s", "0.05"),
        pause=pause,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _quiet(tmp_path)
