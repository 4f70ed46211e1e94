"""The last resort of replica recovery, with real ranks: too few replicas left, or a
replica's restart budget spent, restarts the whole job from its newest checkpoint."""

from __future__ import annotations

import pandas as pd
import pytest

from eagleeye.store import RunReader
from ft_runtime.layout import JobLayout
from tests.eagleeye.replica_helpers import events, final_params_identical, run_replicas, steps_table

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
STEPS = 80


def _check_restarted_from_checkpoint(result, params, reason: str) -> None:
    assert result.succeeded
    timeline = events(result.run_dir)
    job = timeline[timeline["subject"] == "job"]
    recovering = job[job["phase"] == "recovering"]
    assert len(recovering) == 1
    assert recovering["detail"].iloc[0]["reason"].startswith(reason)

    with RunReader(result.run_dir) as reader:
        restores = reader.checkpoints()
    restores = restores[restores["state"] == "RESTORED"]
    # Every replica loaded the same checkpoint, the newest one written before the faults.
    assert sorted(restores["rank"]) == [0, 1, 2]
    assert restores["step"].nunique() == 1
    restored = int(restores["step"].iloc[0])
    assert restored == 19  # --checkpoint-every 20; the faults came at step 30

    steps = steps_table(result.run_dir)
    for rank in (0, 1, 2):
        own = steps[(steps["name"] == "step_time") & (steps["rank"] == rank)]
        last = own[own["attempt"] == own["attempt"].max()]
        assert sorted(last["step"]) == list(range(restored + 1, STEPS))
        # The stream resumed where the checkpoint left it: no batch skipped in the end.
        batches = steps[(steps["name"] == "batch") & (steps["rank"] == rank)]
        final = batches[batches["attempt"] == batches["attempt"].max()]
        earlier = batches[(batches["attempt"] < batches["attempt"].max())]
        kept = earlier[earlier["step"] <= restored]
        trained = sorted([*kept["value"], *final["value"]])
        assert trained == list(range(len(trained)))
    count, identical = final_params_identical(params)
    assert (count, identical) == (3, True)


def test_a_wipe_out_restarts_the_job_from_its_newest_checkpoint(tmp_path) -> None:
    faults = ("kill:rank=1@step=30", "kill:rank=2@step=30")
    result = run_replicas(tmp_path, "wipeout", STEPS, faults, min_replicas=2)
    _check_restarted_from_checkpoint(result, tmp_path / "wipeout" / "params", "wipe-out")


def test_a_spent_restart_budget_restarts_the_job_from_its_newest_checkpoint(tmp_path) -> None:
    result = run_replicas(
        tmp_path, "budget", STEPS, ("kill:rank=1@step=30",), JobLayout(3, 1, 3), max_restarts=0
    )
    _check_restarted_from_checkpoint(result, tmp_path / "budget" / "params", "replica 1 evicted")
    actions = RunReader(result.run_dir).actions()
    assert "the whole job restarted from its newest checkpoint" in actions["detail"].iloc[0]
    assert isinstance(actions, pd.DataFrame)
