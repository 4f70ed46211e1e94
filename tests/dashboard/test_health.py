from __future__ import annotations

import pandas as pd
import pytest

from dashboard.health import job_status, rank_health, ranks_of


def events() -> pd.DataFrame:
    rows = [
        (0.0, "job", "launch", 0, {}),
        (0.0, "rank:0", "launch", 0, {"replica": 0, "node": "node0"}),
        (0.0, "rank:1", "launch", 0, {"replica": 1, "node": "node1"}),
        (50.0, "rank:1", "exited", 0, {"exit_code": -9}),
        (51.0, "job", "recovering", 0, {}),
        (51.0, "job", "launch", 1, {}),
        (51.0, "rank:0", "launch", 1, {"replica": 0, "node": "node0"}),
        (51.0, "rank:1", "launch", 1, {"replica": 1, "node": "node1"}),
    ]
    return pd.DataFrame(rows, columns=["time", "subject", "phase", "attempt", "detail"])


def steps(last_rank1: float) -> pd.DataFrame:
    rows = []
    for rank, last in ((0, 100.0), (1, last_rank1)):
        for step in range(50):
            rows.append((10.0 + step, step, 0, rank, "step_time", 1.0))
        rows.append((last, 60, 1, rank, "step_time", 1.0))
    return pd.DataFrame(rows, columns=["time", "step", "attempt", "rank", "name", "value"])


def test_ettr_counts_each_step_once_at_the_median_step_time() -> None:
    status = job_status(events(), steps(100.0), now=100.0)
    assert status.phase == "launch"
    assert status.attempt == 1
    assert status.current_step == 60
    assert status.ettr == pytest.approx(61 * 1.0 / 100.0)


def test_ranks_are_stale_when_silent_and_exits_belong_to_their_attempt() -> None:
    findings = pd.DataFrame({"time": [50.1], "rank": [1]})
    ranks = ranks_of(events())
    assert list(ranks["node"]) == ["node0", "node1"]
    health = rank_health(ranks, steps(last_rank1=55.0), findings, events(), now=100.0)
    # rank 1's exit and finding were in attempt 0; in attempt 1 it went silent for 45 s.
    assert list(health["health"]) == ["ok", "stale"]
    assert list(health["last_step"]) == [60, 60]
