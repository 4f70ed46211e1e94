"""The converted DDP example (examples/ddp_train_replica.py) under
`eagleeye run --recovery replica --remediate`, 2 replicas of 2 ranks, with faults fired
from outside. Each run ends with every replica's parameters bitwise identical, and the
ledger's audit trail (``EAGLEEYE_LEDGER_LOG``) shows every batch of every replica trained
exactly once (after a job restart: once since the restored checkpoint).

The faults during a catch-up are fired when the rank's log says it began (the lines the
joiner and the source write), not after a guessed delay; the example's ``--load-seconds``
(each state load takes that long, as a bigger model's would) keeps the catch-up open long
enough for the kill to land inside it, and each test checks afterwards that it did.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.eagleeye.replica_helpers import final_params_identical, trained_once

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 100
LONG = 300  # two relaunches of a replica, each some seconds, fit before the others finish


def start_example(
    tmp_path: Path,
    *inject: str,
    extra: tuple[str, ...] = (),
    load_seconds: float = 0.0,
    steps: int = STEPS,
) -> subprocess.Popen[str]:
    """Starts the job; ``load_seconds`` makes each state load of the script take that long
    (the example's knob standing for a bigger model), which keeps a catch-up open long
    enough for a fault fired from outside to land inside it."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    command = [
        sys.executable,
        "-m",
        "eagleeye",
        "run",
        *("--recovery", "replica", "--remediate", "--replicas", "2", "--nproc-per-node", "4"),
        *("--runs-dir", str(tmp_path / "runs"), *extra),
        *[arg for spec in inject for arg in ("--inject", spec)],
        str(ROOT / "examples" / "ddp_train_replica.py"),
        *("--steps", str(steps), "--ckpt", str(tmp_path / "ckpt.pt")),
        *("--checkpoint-every", "10", "--step-seconds", "0.1"),
        *("--load-seconds", str(load_seconds), "--params-out", str(tmp_path / "params")),
    ]
    env = {**os.environ, "EAGLEEYE_LEDGER_LOG": str(ledger), "OMP_NUM_THREADS": "1"}
    out = open(tmp_path / "job.out", "w")  # noqa: SIM115 (the job writes it until it ends)
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)


def finish(tmp_path: Path, job: subprocess.Popen[str]) -> str:
    try:
        job.wait(timeout=380)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    output = (tmp_path / "job.out").read_text()
    assert job.returncode == 0, output[-4000:]
    return output


def run_example(tmp_path: Path, *inject: str, extra: tuple[str, ...] = ()) -> str:
    return finish(tmp_path, start_example(tmp_path, *inject, extra=extra))


def rank_log(tmp_path: Path, replica: int, incarnation: int, rank: int) -> Path:
    return next((tmp_path / "runs").glob(f"**/replica-{replica}-{incarnation}/rank-{rank}.log"))


def wait_for_line(
    tmp_path: Path, job: subprocess.Popen[str], replica: int, incarnation: int, rank: int, text: str
) -> str:
    """Waits until the rank's log holds ``text`` (the evidence that a phase began); returns
    that line. Fails when the job ends first."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert job.poll() is None, (tmp_path / "job.out").read_text()[-4000:]
        try:
            lines = rank_log(tmp_path, replica, incarnation, rank).read_text().splitlines()
        except (StopIteration, FileNotFoundError):
            lines = []
        for line in lines:
            if text in line:
                return line
        time.sleep(0.02)
    raise AssertionError(f"no {text!r} in the log of rank {rank} (replica {replica})")


def kill_rank(tmp_path: Path, replica: int, replica_rank: int, incarnation: int) -> None:
    """SIGKILLs the rank of this job (found by its environment) at that incarnation."""
    want = {
        "EAGLEEYE_LEDGER_LOG": str(tmp_path / "ledger"),
        "EAGLEEYE_REPLICA": str(replica),
        "EAGLEEYE_REPLICA_RANK": str(replica_rank),
        "TORCHELASTIC_RESTART_COUNT": str(incarnation),
    }
    for proc in Path("/proc").iterdir():
        try:
            raw = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        if all(env.get(key) == value for key, value in want.items()):
            os.kill(int(proc.name), signal.SIGKILL)
            return
    raise AssertionError(f"no process for replica {replica} rank {replica_rank}")


def check(tmp_path: Path, steps: int = STEPS) -> dict[int, list[int]]:
    count, same = final_params_identical(tmp_path / "params")
    assert count == 4
    assert same, "the replicas' final parameters differ"
    return trained_once(tmp_path / "ledger", steps)


def test_sigkill_of_a_rank_mid_step(tmp_path: Path) -> None:
    run_example(tmp_path, "kill:rank=3@step=10")
    batches = check(tmp_path)
    assert len(batches[0]) == STEPS  # the survivor trained at every step
    assert len(batches[1]) < STEPS  # the restarted replica missed the steps it was away


def test_sigstop_of_a_rank(tmp_path: Path) -> None:
    run_example(tmp_path, "stop:rank=3@step=10")
    batches = check(tmp_path)
    assert len(batches[0]) == STEPS


def test_two_replicas_killed_in_the_same_step_restart_the_job(tmp_path: Path) -> None:
    run_example(
        tmp_path, "kill:rank=1@step=15", "kill:rank=3@step=15", extra=("--min-replicas", "2")
    )
    check(tmp_path)


def test_a_joiner_killed_during_its_catch_up_is_restarted_and_catches_up(tmp_path: Path) -> None:
    job = start_example(tmp_path, "kill:rank=3@step=10", load_seconds=2.0, steps=LONG)
    wait_for_line(tmp_path, job, 1, 1, 3, "catches up from replica 0")
    kill_rank(tmp_path, replica=1, replica_rank=1, incarnation=1)
    finish(tmp_path, job)
    batches = check(tmp_path, LONG)
    assert len(batches[0]) == LONG  # the source never stopped
    # The kill landed inside the catch-up: that incarnation never trained a step, and
    # the next one caught up.
    assert not (tmp_path / "ledger" / "replica-1-1.jsonl").exists()
    assert "caught up" not in rank_log(tmp_path, 1, 1, 3).read_text()
    assert "caught up" in rank_log(tmp_path, 1, 2, 3).read_text()


def test_a_source_killed_while_it_serves_a_catch_up(tmp_path: Path) -> None:
    job = start_example(tmp_path, "kill:rank=3@step=10", load_seconds=2.0, steps=LONG)
    wait_for_line(tmp_path, job, 1, 1, 3, "catches up from replica 0")
    wait_for_line(tmp_path, job, 0, 0, 1, "serves catch-up request")
    kill_rank(tmp_path, replica=0, replica_rank=1, incarnation=0)
    finish(tmp_path, job)
    check(tmp_path, LONG)
    assert "caught up" not in rank_log(tmp_path, 1, 1, 3).read_text()
