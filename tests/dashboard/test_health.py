from __future__ import annotations

import pandas as pd
import pytest

from dashboard.health import job_status, ongoing_hang, rank_health, ranks_of
from eagleeye.goodput import effective_training
from eagleeye.summary import throughput


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
            rows.append((10.0 + step, step, 0, rank, "tokens", 64.0))
        rows.append((last, 60, 1, rank, "step_time", 1.0))
    return pd.DataFrame(rows, columns=["time", "step", "attempt", "rank", "name", "value"])


NO_FINDINGS = pd.DataFrame(columns=["time", "kind", "scope", "rank", "step", "evidence"])


def hang(time: float, rank: int, evidence: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"time": time, "kind": "hang", "scope": "rank", "rank": rank, "step": 60,
          "evidence": evidence}]
    )  # fmt: skip


def test_ettr_and_throughput_are_the_summarys() -> None:
    meta = {"config": {"replicas": 2}, "result": {"started": 0.0, "ended": 100.0}}
    status = job_status(events(), steps(100.0), meta, NO_FINDINGS, now=500.0)
    assert status.phase == "launch"
    assert status.attempt == 1
    assert status.current_step == 60
    assert status.ettr == effective_training(steps(100.0), 2)[0]
    assert (status.steps_per_s, status.tokens_per_s) == throughput(steps(100.0), 100.0)
    assert status.tokens_per_s == pytest.approx(2 * 50 * 64 / 100.0)


def test_a_live_job_without_steps_for_a_while_shows_no_recent_progress() -> None:
    status = job_status(events(), steps(100.0), {}, NO_FINDINGS, now=200.0)
    assert status.recent_steps_per_s == 0.0
    assert status.wall_s == 200.0
    assert status.steps_per_s > 0  # the run's average, as the summary reports it


def test_a_hang_names_its_culprit_apart_from_the_waiting_ranks() -> None:
    evidence = {"stopped": 1.0, "ranks_waiting": 1.0, "culprit_rank_0": 1.0, "waiting_rank_0": 0.0}
    findings = hang(101.0, 1, evidence)
    status = job_status(events(), steps(100.0), {}, findings, now=120.0)
    assert status.phase == "hung"
    assert status.hang is not None
    assert (status.hang.culprits, status.hang.waiting, status.hang.reason) == (
        (1,),
        (0,),
        "stopped",
    )
    health = rank_health(ranks_of(events()), steps(100.0), findings, events(), 120.0, status.hang)
    assert list(health["health"]) == ["waiting", "hung"]


def test_the_progress_in_the_meta_names_culprits_the_evidence_does_not_list() -> None:
    findings = hang(101.0, 1, {"stopped": 1.0, "ranks_waiting": 1.0})
    progress = {"progress": {"0": "stopped", "1": "stopped"}}
    found = ongoing_hang(events(), steps(100.0), findings, progress)
    assert found is not None
    assert found.culprits == (0, 1)


def test_a_hang_ends_when_a_step_ends_after_it() -> None:
    findings = hang(90.0, 1, {"stopped": 1.0, "culprit_rank_0": 1.0})
    assert ongoing_hang(events(), steps(100.0), findings, {}) is None


def test_ranks_are_stale_when_silent_recovered_after_stepping_again() -> None:
    ranks = ranks_of(events())
    assert list(ranks["node"]) == ["node0", "node1"]
    silent = rank_health(ranks, steps(last_rank1=55.0), NO_FINDINGS, events(), now=100.0)
    # rank 1's exit was in attempt 0; in attempt 1 it went silent for 45 s.
    assert list(silent["health"]) == ["ok", "stale"]
    assert list(silent["last_step"]) == [60, 60]
    stepping = rank_health(ranks, steps(last_rank1=99.0), NO_FINDINGS, events(), now=100.0)
    assert list(stepping["health"]) == ["ok", "recovered"]


def test_a_rank_whose_newest_event_is_a_failed_exit_is_exited() -> None:
    ended = pd.concat(
        [events(), pd.DataFrame([(99.5, "rank:1", "exited", 1, {"exit_code": 1})],
                                columns=events().columns)],
        ignore_index=True,
    )  # fmt: skip
    health = rank_health(ranks_of(ended), steps(99.0), NO_FINDINGS, ended, now=100.0)
    assert list(health["health"]) == ["ok", "exited"]
