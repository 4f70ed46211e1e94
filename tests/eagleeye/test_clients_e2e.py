"""Users' scripts with no Eagle Eye code in them (tests/clients/), under `eagleeye run
--remediate`: never killed while healthy, told apart from a hung one by evidence, and
measured by the zero-code telemetry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eagleeye.launch import JobConfig, run_job
from eagleeye.store import RunReader, newest_run
from ft_runtime.layout import JobLayout
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "tests" / "clients"


def spawn_eagleeye(root: Path, *args: str) -> subprocess.Popen[str]:
    """`eagleeye ARGS` started from ``root`` (this checkout first on PYTHONPATH, which the
    ranks inherit), its output captured."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "eagleeye", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def eagleeye_run(root: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`eagleeye run --remediate` on two ranks, from a folder of its own (this checkout
    first on PYTHONPATH, which the ranks inherit)."""
    command = [sys.executable, "-m", "eagleeye", "run", "--nproc-per-node", "2"]
    command += ["--remediate", "--runs-dir", str(root / "runs"), *args]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        command,
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def quiet(run: Path) -> None:
    """A healthy run: one attempt, no finding, no action."""
    with RunReader(run) as reader:
        assert reader.findings().empty, reader.findings()
        assert reader.actions().empty
        assert reader.meta()["result"]["attempts"] == 1


@pytest.mark.timeout(180)
def test_a_job_that_only_prints_outlives_every_limit_that_could_apply(tmp_path) -> None:
    # 35 s: 15 s past the blocked limit, the collective limit and the "no step telemetry"
    # notice, each lowered to 20 s with its flag (from 60 s, 120 s and 60 s) to keep the
    # test short. Nothing else can apply to a job that sends no telemetry and waits in no
    # collective.
    script = str(CLIENTS / "print_only.py")
    limits = ["--hang-blocked-s", "20", "--hang-collective-s", "20", "--no-step-notice", "20"]
    args = [*limits, script, "--seconds", "35", "--every", "5"]
    result = eagleeye_run(tmp_path, *args, timeout=160)
    assert result.returncode == 0, result.stderr[-2000:]
    run = newest_run(tmp_path / "runs")
    quiet(run)
    log = (run / "logs" / "attempt-0" / "rank-1.log").read_text()
    assert "finished after 3" in log
    assert "rank 0, rank 1: no step telemetry 20 s into attempt 0" in " ".join(
        result.stderr.split()
    )


@pytest.mark.timeout(300)
def test_a_lightning_fit_with_an_8_s_validation_is_not_killed(tmp_path) -> None:
    script = str(CLIENTS / "lightning_train.py")
    args = ["--max_steps", "30", "--val_every", "15", "--val_seconds", "8"]
    result = eagleeye_run(tmp_path, script, *args, "--out_dir", "out", timeout=280)
    assert result.returncode == 0, result.stderr[-2000:]
    run = newest_run(tmp_path / "runs")
    quiet(run)
    with RunReader(run) as reader:
        steps = reader.metric("step_time")
        assert len(steps) >= 29
        assert set(steps.columns) == {0, 1}
        assert reader.metric("loss").notna().all().all()
        # the validations' metric syncs (sync_dist) are seen without code in the script
        assert "all_reduce" in set(reader.collectives()["op"])


@pytest.mark.timeout(300)
def test_a_healthy_ddp_job_with_its_own_checkpoints_draws_no_finding(tmp_path) -> None:
    # its evaluations and rank 0's torch.save every 20 iterations pause the loop; none of
    # it is a fault
    args = ["--max_iters", "80", "--eval_interval", "20", "--out_dir", "out"]
    result = eagleeye_run(tmp_path, str(CLIENTS / "ddp_train.py"), *args, timeout=280)
    assert result.returncode == 0, result.stderr[-2000:]
    run = newest_run(tmp_path / "runs")
    quiet(run)
    with RunReader(run) as reader:
        assert len(reader.metric("step_time")) >= 79
        assert len(reader.checkpoints()) >= 4  # the script's own saves, seen without code


def _stop_rank(run_root: Path, rank: int, after_step: int, out: dict[str, float]) -> None:
    """Waits for ``rank`` to report ``after_step``, then SIGSTOPs it (as a test would)."""
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            reader = RunReader(newest_run(run_root))
        except Exception:
            continue
        with reader:
            steps = reader.samples(names=["step_time"], ranks=[rank])
            if steps.empty or steps["step"].max() < after_step:
                continue
            launch = reader.events().query(f"subject == 'rank:{rank}' and phase == 'launch'")
        out["time"] = time.time()
        os.kill(int(launch.iloc[0]["detail"]["pid"]), signal.SIGSTOP)
        return


@pytest.mark.timeout(300)
def test_a_stopped_ddp_rank_is_found_from_evidence_with_every_ranks_stack(tmp_path) -> None:
    # Steps of 0.2 to 0.5 s on 2 CPU cores: the script's model, a size up.
    args = ["--max_iters", "30", "--batch_size", "64", "--n_embd", "256"]
    args += ["--eval_interval", "1000", "--out_dir", str(tmp_path / "out")]
    config = JobConfig(
        script=str(CLIENTS / "ddp_train.py"),
        script_args=args,
        layout=JobLayout(nproc_per_node=2),
        remediate=True,
        runs_dir=str(tmp_path / "runs"),
    )
    stopped: dict[str, float] = {}
    stopper = threading.Thread(target=_stop_rank, args=(tmp_path / "runs", 1, 12, stopped))
    stopper.start()
    result = run_job(config)
    stopper.join()
    assert result.succeeded
    with RunReader(result.run_dir) as reader:
        findings, actions = reader.findings(), reader.actions()
        stacks = reader.stacks()
        step_times = reader.samples(names=["step_time"])
        losses = reader.metric("loss")
        collectives = reader.collectives()
    (hang,) = findings.itertuples()
    assert (hang.kind, hang.rank, hang.detector) == ("hang", 1, "progress_stall")
    assert hang.evidence["stopped"] == 1.0
    assert hang.evidence["waiting_rank_0"] == 0.0  # rank 0 waits for it, never blamed
    first = step_times[step_times["attempt"] == 0]
    median = float(first["value"].median())
    assert hang.time - stopped["time"] <= 3 * median, (hang.time - stopped["time"], median)
    assert list(actions["kind"]) == ["restart"]
    assert actions.iloc[0]["status"] == "done"
    # every rank's stack, taken before the restart: the stopped one and the one waiting
    assert sorted(stacks["rank"]) == [0, 1]
    assert set(stacks["finding_id"]) == {hang.id}
    assert (stacks["method"] == "py-spy").all()
    assert stacks.set_index("rank").loc[1, "state"] == "T"
    assert all("ddp_train.py" in text for text in stacks["text"])
    # zero-code telemetry filled step time, loss and collective timings
    assert set(first["rank"]) == {0, 1}
    assert first["step"].max() >= 12
    assert losses.loc[0:11].notna().all().all()
    assert {"all_reduce"} <= set(collectives["op"])
    assert (collectives["bytes"] > 0).all()


@pytest.mark.timeout(240)
def test_a_hooked_job_whose_rank_pauses_8_s_while_its_peer_waits_is_not_killed(
    tmp_path,
) -> None:
    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=tiny_workload(16, 5),
        layout=JobLayout(nproc_per_node=2),
        remediate=True,
        inject=("slow:rank=1@step=6,seconds=8,steps=1",),
        runs_dir=str(tmp_path),
    )
    result = run_job(config)
    assert result.succeeded
    with RunReader(result.run_dir) as reader:
        assert "hang" not in set(reader.findings()["kind"])
        assert reader.actions().empty
        assert reader.meta()["result"]["attempts"] == 1
        waits = reader.samples(names=["in_collective"], ranks=[0])
        assert waits["value"].max() > 0  # rank 0 waited for it in the all-reduce
        assert set(reader.samples(names=["pause"])["value"]) == {0.0, 1.0}  # checkpoints
        steps = reader.samples(names=["step_time"])
    # the loop's own steps, once each: the zero-code telemetry stood aside
    assert len(steps) == 32
    assert not steps.duplicated(["rank", "step"]).any()
