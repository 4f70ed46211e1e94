"""An agent's judge of its own ranks (``HostJudge``) and the controller's check of what it
reports (``host_findings``), with the one-fault-one-finding rule of the reduced judge."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np
import pytest

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.agents.hostjudge import HostJudge
from eagleeye.agents.judging import MAX_HOST_FINDINGS, ReducedJudge, host_findings
from ft_runtime.layout import JobLayout

LAYOUT = JobLayout(nnodes=4, nproc_per_node=8, replicas=2)  # node 2 holds ranks 16..23


def _host_steps(judge: HostJudge, steps: range, jitter: float, slow_from: int, attempt: int = 0):
    """Node 2's 8 ranks in lockstep: each computes (its GPU's own speed, noise of
    ``jitter``) and waits in the all-reduce for the slowest; rank 19 computes 10 % longer
    from ``slow_from``. Returns the judge's findings."""
    rng = np.random.default_rng(7)
    speed = 1.0 + 0.015 * rng.standard_normal(8)
    found = []
    for step in steps:
        compute = 200.0 * speed * np.exp(jitter * rng.standard_normal(8))
        if step >= slow_from:
            compute[3] *= 1.1
        step_ms = compute.max() + 20.0
        values = {
            16 + i: {"compute_ms": c, "comm_ms": step_ms - c - 1.0, "data_wait_ms": 1.0}
            for i, c in enumerate(compute)
        }
        found += judge.judge(attempt, step, {}, values, 100.0 + step)
    return found


def test_the_host_finds_a_rank_ten_per_cent_slower_within_twenty_steps() -> None:
    found = _host_steps(HostJudge(), range(120), jitter=0.01, slow_from=60)
    assert [(f.kind, f.subject.rank, f.severity) for f in found] == [
        ("slow_rank", 19, Severity.WARN)
    ]
    assert 60 < (found[0].step or 0) <= 80


def test_a_noisy_host_claims_nothing() -> None:
    # A shared CPU host: compute times stray by a third; a 10 % slowdown is not told apart.
    assert _host_steps(HostJudge(), range(120), jitter=0.3, slow_from=60) == []


def test_a_new_attempt_is_a_new_baseline_and_late_steps_of_the_old_one_are_ignored() -> None:
    judge = HostJudge()
    _host_steps(judge, range(40), jitter=0.01, slow_from=1000)
    first = judge.pipeline
    # attempt 1: the rank is slow from its first step; a rank slow since the start of a
    # baseline is its own offset, not a change, so nothing is claimed
    assert _host_steps(judge, range(100), jitter=0.01, slow_from=0, attempt=1) == []
    assert judge.pipeline is not first
    assert judge.attempt == 1
    second = judge.pipeline
    assert _host_steps(judge, range(40, 45), jitter=0.01, slow_from=0, attempt=0) == []
    assert judge.pipeline is second  # the late steps of attempt 0 touched nothing


def _finding(**changes) -> dict:
    base = Finding(
        "slow_rank",
        Subject(rank=19),
        4.2,
        Severity.WARN,
        123.0,
        77,
        {"compute_ms": 220.0, "peer_median": 200.0},
        "peer_outlier/quiet",
    ).to_json()
    base.update(changes)
    return base


def test_a_sound_host_finding_is_placed_in_the_job_and_named_for_its_host() -> None:
    attempt, found = host_findings(
        {"attempt": 2, "findings": [_finding()]}, "a2", 2, LAYOUT, now=999.0
    )
    assert attempt == 2
    (f,) = found
    assert f.subject == Subject(replica=1, rank=19, node="node2")  # from the layout
    assert (f.kind, f.step, f.time, f.detector) == (
        "slow_rank",
        77,
        999.0,
        "host:peer_outlier/quiet",
    )
    assert dict(f.evidence) == {"compute_ms": 220.0, "peer_median": 200.0}


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"kind": "hang"}, "kind 'hang'"),
        ({"kind": "xid"}, "kind 'xid'"),
        ({"severity": "critical"}, "only warn"),
        ({"subject": {"rank": 3}}, "not on node rank 2"),  # another host's rank
        ({"subject": {"rank": 99}}, "no rank of the job"),
        ({"subject": {"node": "node2"}}, "no rank of the job"),
        ({"step": None}, "is of a step"),
        ({"score": "nan"}, "score nan"),
        ({"evidence": {f"e{i}": 1.0 for i in range(65)}}, "65 evidence"),
        ({"detector": "x" * 129}, "over 128"),
        ({"severity": "fatal"}, "does not parse"),
        ({"subject": "rank 19"}, "does not parse"),
    ],
)
def test_an_unsound_host_finding_is_dropped_and_said(changes, why, caplog) -> None:
    body = {"attempt": 0, "findings": [_finding(**changes), _finding(step=80)]}
    with caplog.at_level(logging.WARNING):
        _, found = host_findings(body, "a2", 2, LAYOUT, now=1.0)
    assert [f.step for f in found] == [80]  # the sound one is kept
    assert why in caplog.text


@pytest.mark.parametrize(
    "body",
    [
        {"findings": [_finding()]},  # no attempt
        {"attempt": -1, "findings": [_finding()]},
        {"attempt": 0, "findings": "slow_rank"},
        {"attempt": 0, "findings": [_finding()] * (MAX_HOST_FINDINGS + 1)},
    ],
)
def test_a_malformed_findings_report_is_dropped_whole(body, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert host_findings(body, "a2", 2, LAYOUT, now=1.0) == (-1, [])
    assert "dropped the findings of a2" in caplog.text


def _warn(detector: str, step: int, kind: str = "slow_rank", rank: int = 19) -> Finding:
    return Finding(kind, Subject(1, rank, "node2"), 1.0, Severity.WARN, 1.0, step, {}, detector)


def test_one_fault_crossing_two_detectors_bars_is_one_finding(tmp_path) -> None:
    judge = ReducedJudge(store=None)
    first = _warn("stands_out", 100)
    assert judge.once([first]) == [first]
    assert judge.once([_warn("host:peer_outlier/quiet", 130)]) == []  # the same fault
    assert judge.suppressed == 1
    again = _warn("stands_out", 200)  # re-armed by its own hysteresis: a new fault
    assert judge.once([again]) == [again]
    other = [
        _warn("host:peer_outlier/quiet", 210, rank=20),
        _warn("host:trend", 210, "memory_leak"),
    ]
    assert judge.once(other) == other  # another rank, another kind
    late = _warn("host:peer_outlier/quiet", 200 + 151)
    assert judge.once([late]) == [late]  # past the window the fault may have ended
    critical = Finding(
        "nan", Subject(1, 19, "node2"), math.inf, Severity.CRITICAL, 1.0, 352, {}, "a"
    )
    assert judge.once([critical, critical]) == [critical, critical]  # never held back


def test_the_controller_finds_a_spike_of_the_job_s_highest_loss_on_the_job() -> None:
    from collector.types import Frame

    judge = ReducedJudge(None)
    found = []
    for step in range(60):
        loss = 7.0 if step == 50 else 2.0 + 0.02 * (step % 3)
        job = Frame(Subject(), step, float(step), {"loss.max": loss, "loss.median": 2.0})
        # a host standing out now and then has its own frame: no series of its own
        node = Frame(Subject(node="node1"), step, float(step), {"loss.max": 9.0 * (step % 7)})
        found += judge.judge([node, job], float(step))
    assert [(f.kind, f.subject.scope, f.step) for f in found] == [("loss_spike", "job", 50)]


def test_symptoms_of_a_fault_still_on_are_not_new_findings() -> None:
    judge = ReducedJudge(store=None)
    hang = Finding("hang", Subject(1, 19, "node2"), 1.0, Severity.CRITICAL, 1.0, 300, {}, "h")
    judge.note(hang)  # answered by the controller's hang rules, outside this judge
    power = _warn("host:generic_peer", 310, "metric_outlier")  # the hung rank's GPU idles
    assert judge.once([power]) == []
    elsewhere = _warn("host:generic_peer", 310, "metric_outlier", rank=21)
    assert judge.once([elsewhere]) == [elsewhere]  # another rank: its own finding
    drop = Finding("throughput_drop", Subject(), 1.0, Severity.WARN, 1.0, 320, {}, "tc")
    assert judge.once([drop]) == []  # the job slows while the fault may still be on
    later = replace(drop, step=300 + 151 + 10)  # past the window after the hang
    assert judge.once([later]) == [later]
    assert judge.suppressed == 2


def test_a_host_standing_out_now_and_then_is_no_step_time_series() -> None:
    from collector.types import Frame

    judge = ReducedJudge(None)
    found = []
    for step in range(70):
        job = Frame(Subject(), step, float(step), {"step_time.max": 3.8 + 0.01 * (step % 2)})
        frames = [job]
        if 10 <= step < 26 or 40 <= step < 56:  # the host's own frame, while it stands out
            slow = 4.0 if step < 26 else 14.0
            node = Frame(Subject(node="node1"), step, float(step), {"step_time.max": slow})
            frames.insert(0, node)
        found += judge.judge(frames, float(step))
    assert found == []
