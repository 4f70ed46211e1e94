"""The Lightning example (examples/lightning_train_replica.py, ``ReplicaStrategy``) under
`eagleeye run --recovery replica --remediate`, 2 replicas of 2 ranks, one rank SIGKILLed
mid-run: its replica restarts and catches up, every replica's parameters end bitwise
identical, and the ledger's audit trail shows every batch trained exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eagleeye.replica_helpers import final_params_identical

pytest.importorskip("lightning")
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(500)]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 100  # 0.3 s each: the survivor must not finish before the restarted replica
# has imported Lightning again (about 12 s on a busy 2-core machine) and caught up


def trained_batches(ledger: Path) -> dict[int, list[int]]:
    """Every replica's trained batches from the audit lines of the committed steps (a
    step's line from the newest incarnation counts)."""
    newest: dict[int, tuple[int, list[list[int]]]] = {}
    for path in ledger.glob("replica-*.jsonl"):
        incarnation = int(path.stem.rsplit("-", 1)[1])
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry["step"] not in newest or newest[entry["step"]][0] < incarnation:
                newest[entry["step"]] = (incarnation, entry["trained"])
    assert sorted(newest) == list(range(STEPS))  # every step committed
    batches: dict[int, list[int]] = {}
    for step in sorted(newest):
        for replica, batch in newest[step][1]:
            batches.setdefault(replica, []).append(batch)
    return batches


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
    batches = trained_batches(ledger)
    for replica, got in batches.items():  # each batch once, none skipped, in order
        assert got == list(range(len(got))), (replica, got)
    assert len(batches[0]) == STEPS  # the survivor trained at every step
    assert len(batches[1]) < STEPS  # the restarted replica missed the steps it was away
    assert len(list(ledger.glob("replica-1-*.jsonl"))) == 2  # its first run and its restart
