"""The README's demo command, shortened: the kill is recorded, detected and remediated by
restarting only its replica, which catches up and ends bitwise equal to the others."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from eagleeye.store import RunReader

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]


def test_demo_detects_and_remediates_the_kill_and_matches_the_reference(demo_run) -> None:
    # `eagleeye demo --steps 90 --kill-step 10`, run once for the tests that read it
    # (tests/eagleeye/conftest.py)
    output = demo_run.output
    assert demo_run.returncode == 0, output[-3000:]
    assert "process_exit on rank 3" in output
    # every finding names its host (the demo runs on this machine)
    assert f"│ process_exit │ rank 3 │ {socket.gethostname()} │" in output
    assert "Final parameters of the 4 ranks that finished: bitwise identical" in output
    assert "Effective training time ratio (ETTR)" in output
    # Each injected fault's finding, with its evidence.
    assert "The finding that answered each fault, with its evidence" in output
    assert "exit_code=-9" in output
    run = demo_run.faulted
    reader = RunReader(run)
    assert reader.faults().iloc[0]["spec"] == "kill:rank=3@step=10"
    assert reader.findings().iloc[0]["kind"] == "process_exit"
    action = reader.actions().iloc[0]
    assert (action["kind"], action["target"], action["status"]) == ("restart", "replica:1", "done")
    assert reader.samples(names=["step_time"])["step"].max() == 89
    # the restarted replica's state came from its healthy peer, and the summary says so
    table = reader.checkpoints()
    restored = table[table["state"] == "RESTORED"]
    assert not restored.empty
    assert set(restored["tier"]) == {"peer"}
    assert set(restored["rank"]) <= {2, 3}
    assert "Restores (where each restarted rank's state came from)" in output
    assert f"{run}/run.db" in output
    # The actions came from the shipped policy file, and the summary says which.
    policy = reader.meta()["config"]["policy_file"]
    assert policy.endswith("remediation/policies/replica.toml")
    assert f"Actions came from the policy file {policy}" in output
    assert "replica" in action["reason"]


def run_demo(*args: str) -> str:
    """Runs `eagleeye demo` with these arguments; its output, whitespace collapsed."""
    result = subprocess.run(
        [sys.executable, "-m", "eagleeye", "demo", *args],
        capture_output=True,
        text=True,
        timeout=400,
        env={"COLUMNS": "160", **os.environ},
    )
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, output[-3000:]
    return output


def test_demo_with_synchronous_restarts_restores_every_rank_from_memory(tmp_path) -> None:
    """`--recovery job`: the ranks snapshot into their node's holder; after the kill every
    rank restores from the holder's memory, and the summary names the tier and the time."""
    output = run_demo(
        *("--steps", "30", "--kill-step", "24", "--recovery", "job", "--no-reference"),
        *("--runs-dir", str(tmp_path)),
    )
    (run,) = list(tmp_path.iterdir())
    reader = RunReader(run)
    table = reader.checkpoints()
    saved = table[(table["state"] == "CACHED") & (table["attempt"] == 0)]
    assert set(saved["step"]) == {19}
    assert set(saved["tier"]) == {"memory"}
    restored = table[(table["state"] == "RESTORED") & (table["attempt"] == 1)]
    # every rank of the restarted job resumed from the snapshot held in memory
    assert sorted(restored["rank"]) == [0, 1, 2, 3]
    assert set(restored["step"]) == {19}
    assert set(restored["tier"]) == {"memory"}
    assert (restored["seconds"] > 0).all()
    assert "Restores (where each restarted rank's state came from)" in output
    for row in restored.to_dict("records"):
        line = f"│ {row['rank']} │ 1 │ 19 │ memory │ {row['seconds'] * 1000:.1f} ms │"
        assert line in output, output[-3000:]
