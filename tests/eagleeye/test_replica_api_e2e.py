"""The converted DDP example (examples/ddp_train_replica.py) under
`eagleeye run --recovery replica --remediate`, 2 replicas of 2 ranks, with faults fired
from outside. Each run ends with every replica's parameters bitwise identical, and the
ledger's audit trail (``EAGLEEYE_LEDGER_LOG``) shows every batch of every replica trained
exactly once (after a job restart: once since the restored checkpoint).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eagleeye.replica_helpers import final_params_identical

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 100


def run_example(tmp_path: Path, *inject: str, extra: tuple[str, ...] = ()) -> str:
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
        *("--steps", str(STEPS), "--ckpt", str(tmp_path / "ckpt.pt")),
        *("--checkpoint-every", "10", "--step-seconds", "0.1"),
        *("--params-out", str(tmp_path / "params")),
    ]
    env = {**os.environ, "EAGLEEYE_LEDGER_LOG": str(ledger), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=380, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def trained_once(ledger: Path) -> dict[int, list[int]]:
    """Every replica's trained batches, from the audit lines of the committed steps; for
    a step committed more than once (a job restart went back before it), the newest
    incarnation's line counts. Asserts that no batch was trained twice."""
    newest: dict[int, tuple[int, list[list[int]]]] = {}
    for path in ledger.glob("replica-*.jsonl"):
        incarnation = int(path.stem.rsplit("-", 1)[1])
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            step = entry["step"]
            if step not in newest or newest[step][0] < incarnation:
                newest[step] = (incarnation, entry["trained"])
    batches: dict[int, list[int]] = {}
    for step in sorted(newest):
        for replica, batch in newest[step][1]:
            batches.setdefault(replica, []).append(batch)
    for replica, got in batches.items():
        assert sorted(got) == got, f"replica {replica} trained out of order: {got}"
        assert len(set(got)) == len(got), f"replica {replica} trained a batch twice: {got}"
        assert got == list(range(len(got))), f"replica {replica} skipped a batch: {got}"
    assert sorted(newest) == list(range(STEPS)), sorted(newest)
    return batches


def check(tmp_path: Path) -> dict[int, list[int]]:
    count, same = final_params_identical(tmp_path / "params")
    assert count == 4
    assert same, "the replicas' final parameters differ"
    return trained_once(tmp_path / "ledger")


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
