"""Replica recovery end to end: real ranks, real kills and stops, survivors that go on.

Three replicas of one rank each on three virtual nodes. A killed rank costs only its
replica: the others never stop, the replica restarts, catches up from a healthy peer and
rejoins, and afterwards every replica holds bitwise the same parameters. Timing figures
(step rate during the outage, stall) are measured by the benchmark, not asserted here.
"""

from __future__ import annotations

import pandas as pd
import pytest

from eagleeye.store import RunReader
from tests.eagleeye.replica_helpers import (
    events,
    final_params_identical,
    run_replicas,
    steps_table,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]
STEPS = 240


def _committed_batches(steps: pd.DataFrame, rank: int) -> list[int]:
    batches = steps[(steps["name"] == "batch") & (steps["rank"] == rank)]
    return [int(b) for b in batches.sort_values("time")["value"]]


def test_killed_ranks_cost_only_their_replica_which_catches_up_bit_for_bit(tmp_path) -> None:
    # One kill between steps (rank 1), one in the middle of backward (rank 2).
    faults = ("kill:rank=1@step=10", "kill:rank=2@step=40,phase=backward")
    result = run_replicas(tmp_path, "faulted", STEPS, faults)
    assert result.succeeded
    steps = steps_table(result.run_dir)
    timeline = events(result.run_dir)

    # Replica 0 never stopped: one process, every step once, exit 0.
    survivor = steps[(steps["name"] == "step_time") & (steps["rank"] == 0)]
    assert sorted(survivor["step"]) == list(range(STEPS))
    assert set(survivor["attempt"]) == {0}
    exits = timeline[(timeline["subject"] == "rank:0") & (timeline["phase"] == "exited")]
    assert [d["exit_code"] for d in exits["detail"]] == [0]

    # Both victims were dropped from the quorum, restarted, and caught up from a peer.
    for replica in (1, 2):
        phases = list(timeline[timeline["subject"] == f"replica:{replica}"]["phase"])
        after = phases[phases.index("exited") :][:4]
        assert after == ["exited", "recovering", "launch", "pre_check"]
        assert "running" in phases[phases.index("recovering") :]
        catch_up = steps[(steps["name"] == "catch_up") & (steps["rank"] == replica)]
        assert catch_up["value"].sum() == 1.0  # one zero-gradient step, then normal training
    quorum = timeline[timeline["subject"] == "quorum"]
    removed = [d.get("removed") for d in quorum["detail"] if "removed" in d]
    assert removed == [1, 2]

    # Survivors' step while a peer was missing averaged over the contributors only.
    replicas = steps[(steps["name"] == "replicas") & (steps["rank"] == 0)]
    assert {2.0, 3.0} <= set(replicas["value"])
    assert replicas.sort_values("step")["value"].iloc[-1] == 3.0  # everyone back at the end

    # Every replica's batches: each trained exactly once, in order, none skipped.
    for rank in (0, 1, 2):
        batches = _committed_batches(steps, rank)
        assert batches == list(range(len(batches)))

    count, identical = final_params_identical(tmp_path / "faulted" / "params")
    assert count == 3
    assert identical

    # the fault-free reference: no restart for survivors to outrun, so its steps are not
    # padded (the padding is a sleep after the step's work)
    reference = run_replicas(tmp_path, "reference", STEPS, step_floor_s=0.0)
    assert reference.succeeded
    ref_steps = steps_table(reference.run_dir)
    tail = (STEPS - 20, STEPS)

    def tail_loss(frame: pd.DataFrame) -> float:
        loss = frame[(frame["name"] == "loss") & frame["step"].between(*tail)]
        return float(loss["value"].mean())

    assert abs(tail_loss(steps) - tail_loss(ref_steps)) < 0.15 * tail_loss(ref_steps)
    ref_count, ref_identical = final_params_identical(tmp_path / "reference" / "params")
    assert (ref_count, ref_identical) == (3, True)


def test_a_stopped_rank_is_found_from_heartbeats_and_its_replica_restarted(tmp_path) -> None:
    result = run_replicas(tmp_path, "stopped", 120, ("stop:rank=2@step=15",))
    assert result.succeeded
    timeline = events(result.run_dir)
    quorum = timeline[timeline["subject"] == "quorum"]
    drops = [d for d in quorum["detail"] if d.get("removed") == 2]
    assert len(drops) == 1
    assert drops[0]["reason"].startswith("hung")
    with RunReader(result.run_dir) as reader:
        findings, actions = reader.findings(), reader.actions()
    # the fencing kill's cause is the finding: a hang on the stopped rank, the kill its action
    (hang,) = findings[findings["kind"] == "hang"].itertuples()
    assert (hang.rank, hang.detector) == (2, "quorum_stall")
    assert hang.evidence["late_rank_2"] == 1.0
    # found stopped (its process in state T) while the others waited, not by a silence timer
    assert hang.evidence["stopped_rank_2"] == 1.0
    assert hang.evidence["limit_s"] > 0
    fenced = actions[actions["finding_id"] == hang.id]
    assert list(zip(fenced["kind"], fenced["status"], strict=True)) == [("isolate", "done")]
    stop = RunReader(result.run_dir).faults().iloc[0]
    drop_time = quorum[[d.get("removed") == 2 for d in quorum["detail"]]]["time"].iloc[0]
    # Detection delay in median step times (the pace before the stop), from the store: a
    # step for the others to arrive, then the controller's next look finds the rank stopped.
    steps = steps_table(result.run_dir)
    before = steps[(steps["name"] == "step_time") & (steps["time"] < stop["time"])]
    delay_steps = (drop_time - stop["time"]) / float(before["value"].median())
    assert 0.0 < delay_steps <= 3.0
    phases = list(timeline[timeline["subject"] == "replica:2"]["phase"])
    assert "recovering" in phases
    assert phases[-1] == "running"
    for rank in (0, 1):
        survivor = steps[(steps["name"] == "step_time") & (steps["rank"] == rank)]
        assert sorted(survivor["step"]) == list(range(120))
    count, identical = final_params_identical(tmp_path / "stopped" / "params")
    assert count == 3
    assert identical
