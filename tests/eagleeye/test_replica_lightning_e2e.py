"""The Lightning example (examples/lightning_train_replica.py, ``ReplicaStrategy``) under
`eagleeye run --recovery replica --remediate`, 2 replicas of 2 ranks, one rank SIGKILLed
mid-run: its replica restarts and catches up, every replica's parameters end bitwise
identical, and the ledger's audit trail shows every batch trained exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eagleeye.replica_helpers import final_params_identical, trained_once

pytest.importorskip("lightning")
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(500)]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 100  # 0.3 s each: the survivor must not finish before the restarted replica
# has imported Lightning again (about 12 s on a busy 2-core machine) and caught up


def test_the_lightning_example_survives_a_sigkill(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    command = [
        sys.executable,
        "-m",
        "eagleeye",
        "run",
        *("--recovery", "replica", "--remediate", "--replicas", "2", "--nproc-per-node", "4"),
        *("--runs-dir", str(tmp_path / "runs"), "--inject", "kill:rank=3@step=10"),
        str(ROOT / "examples" / "lightning_train_replica.py"),
        *("--steps", str(STEPS), "--step-seconds", "0.3"),
        *("--params-out", str(tmp_path / "params")),
    ]
    env = {**os.environ, "EAGLEEYE_LEDGER_LOG": str(ledger), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=480, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert final_params_identical(tmp_path / "params") == (4, True)
    batches = trained_once(ledger, STEPS)  # every step; each batch once, none skipped, in order
    assert len(batches[0]) == STEPS  # the survivor trained at every step
    assert len(batches[1]) < STEPS  # the restarted replica missed the steps it was away
    assert len(list(ledger.glob("replica-1-*.jsonl"))) == 2  # its first run and its restart
