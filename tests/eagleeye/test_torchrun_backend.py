"""Stock torchrun with `--rdzv-backend eagleeye`: a user's DDP script (tests/clients) gets
Eagle Eye's detection and job restarts without `eagleeye run`.

Real torchrun (torch.distributed.run), real gloo ranks, the backend found through the
package's `torchrun.handlers` entry point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from eagleeye.store import RunReader
from ft_runtime.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "clients" / "ddp_train.py"


def _torchrun(root: Path, conf: str, iters: int) -> subprocess.Popen[str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "eagleeye",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port('127.0.0.1')}",
            "--rdzv-id",
            "ddp-job",
            "--rdzv-conf",
            f"eagleeye_runs_dir={root / 'runs'}{conf}",
            "--max-restarts",
            "1",
            "-m",
            "eagleeye.boot",
            str(SCRIPT),
            "--max_iters",
            str(iters),
            "--out_dir",
            str(root / "out"),
            "--eval_interval",
            "1000",
        ],  # fmt: skip
        cwd=root,
        env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run_dir(root: Path, timeout_s: float = 60.0) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [p for p in (root / "runs").glob("ddp-job-*") if (p / "run.db").exists()]
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError("torchrun made no Eagle Eye run folder")


def _steps_of(run_dir: Path, rank: int) -> int:
    try:
        with RunReader(run_dir) as reader:
            steps = reader.samples(names=["step_time"])
    except Exception:
        return 0
    mine = steps[steps["rank"] == rank] if not steps.empty else steps
    return 0 if mine.empty else int(mine["step"].max())


def _worker(torchrun: subprocess.Popen[str], rank: int) -> psutil.Process:
    for child in psutil.Process(torchrun.pid).children():
        try:
            if child.environ().get("RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no worker of rank {rank}")


def _stop_rank_once_training(torchrun: subprocess.Popen[str], root: Path, rank: int) -> Path:
    """SIGSTOPs the rank once the store shows it has trained 5 steps."""
    run_dir = _run_dir(root)
    deadline = time.monotonic() + 120
    while _steps_of(run_dir, rank) < 5:
        assert time.monotonic() < deadline, "the rank never trained 5 steps"
        assert torchrun.poll() is None, torchrun.communicate()[0][-3000:]
        time.sleep(0.2)
    _worker(torchrun, rank).send_signal(signal.SIGSTOP)
    return run_dir


def _finish(torchrun: subprocess.Popen[str], timeout_s: float = 240) -> str:
    try:
        out, _ = torchrun.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(torchrun.pid).children(recursive=True):
            child.send_signal(signal.SIGCONT)
            child.kill()
        torchrun.kill()
        out, _ = torchrun.communicate()
        raise AssertionError(f"torchrun did not end:\n{out[-4000:]}") from None
    return out


def _left_behind(torchrun: subprocess.Popen[str]) -> list[str]:
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if str(SCRIPT) in line and "torch.distributed.run" not in line:
            left.append(f"{proc.pid} {line[:100]}")
    return left


def test_a_healthy_job_is_watched_and_left_alone(tmp_path: Path) -> None:
    torchrun = _torchrun(tmp_path, "", iters=30)
    out = _finish(torchrun)
    assert torchrun.returncode == 0, out[-3000:]
    with RunReader(_run_dir(tmp_path)) as reader:
        meta, findings, actions = reader.meta(), reader.findings(), reader.actions()
        steps = reader.samples(names=["step_time"])
    assert meta["result"]["succeeded"] is True, meta
    assert meta["config"]["launcher"] == "torchrun"
    assert findings.empty, findings
    assert actions.empty, actions
    assert set(steps["rank"]) == {0, 1}  # the zero-code telemetry of both ranks
    assert int(steps["step"].max()) >= 25
    assert not _left_behind(torchrun)


def test_a_stopped_rank_is_found_by_evidence_and_every_worker_restarted(tmp_path: Path) -> None:
    torchrun = _torchrun(tmp_path, ",eagleeye_remediate=1", iters=60)
    run_dir = _stop_rank_once_training(torchrun, tmp_path, rank=1)
    out = _finish(torchrun)
    assert torchrun.returncode == 0, out[-4000:]
    with RunReader(run_dir) as reader:
        meta, findings, actions = reader.meta(), reader.findings(), reader.actions()
        events, stacks = reader.events(), reader.stacks()
    hangs = findings[findings["kind"] == "hang"]
    assert list(hangs["rank"]) == [1], findings  # one finding, on the stopped rank
    assert hangs.iloc[0]["evidence"]["stopped"] == 1.0
    assert not stacks.empty  # every rank's stack, taken before anything acted
    restart = actions[actions["kind"] == "restart"]
    assert list(restart["status"]) == ["done"], actions
    assert not restart["dry_run"].any()
    launches = events[(events["subject"] == "job") & (events["phase"] == "launch")]
    assert list(launches["attempt"]) == [0, 1], events  # a new rendezvous round
    assert meta["result"] == {**meta["result"], "succeeded": True, "attempts": 2}
    assert "asked torchrun's agents for a new rendezvous round" in out
    assert not _left_behind(torchrun)


def test_without_remediate_the_action_is_only_decided(tmp_path: Path) -> None:
    torchrun = _torchrun(tmp_path, "", iters=40)
    run_dir = _stop_rank_once_training(torchrun, tmp_path, rank=0)
    deadline = time.monotonic() + 120
    while True:
        with RunReader(run_dir) as reader:
            actions = reader.actions()
        if not actions.empty:
            break
        assert time.monotonic() < deadline, "no action decided for the stopped rank"
        time.sleep(0.3)
    assert actions["dry_run"].all(), actions
    _worker(torchrun, 0).send_signal(signal.SIGCONT)  # the operator's call: it trains on
    out = _finish(torchrun)
    assert torchrun.returncode == 0, out[-3000:]
    with RunReader(run_dir) as reader:
        meta, events = reader.meta(), reader.events()
    launches = events[(events["subject"] == "job") & (events["phase"] == "launch")]
    assert len(launches) == 1  # nothing was restarted
    assert meta["result"]["succeeded"] is True


def test_an_unknown_eagleeye_key_stops_torchrun_with_its_name(tmp_path: Path) -> None:
    torchrun = _torchrun(tmp_path, ",eagleeye_remediat=1", iters=5)
    out = _finish(torchrun, timeout_s=120)
    assert torchrun.returncode != 0
    assert "unknown --rdzv-conf keys ['eagleeye_remediat']" in out
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
