"""A stopped rank across hosts: the agent's looks at its ranks' processes (a real process
stopped with SIGSTOP) and the controller's judgement of them (times given by the test)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from collector.types import Frame, Sample, Subject
from eagleeye.agents.stopped import STOPPED, StopLooks, StoppedRankHang
from tests.eagleeye.procs import stop


def stopped(rank: int, value: float, attempt: int = 0) -> Sample:
    return Sample(
        STOPPED, value, 0.0, {"rank": str(rank), "node": "node1", "attempt": str(attempt)}
    )


def job(step: int, step_time: float = 0.1) -> Frame:
    return Frame(Subject(), step, 0.0, {"step_time.median": step_time})


def stepping(hang: StoppedRankHang, steps: range, at: float = 0.0) -> None:
    for step in steps:
        hang.job_step(job(step), at + step * 0.1)


def test_a_stopped_process_is_told_after_two_looks_repeated_and_cleared() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    looks = StopLooks()
    try:
        assert looks.look({3: (child.pid, 0)}, "node1", 0.0) == []
        stop(child.pid)
        assert looks.look({3: (child.pid, 0)}, "node1", 1.0) == []  # one look is not enough
        told = looks.look({3: (child.pid, 0)}, "node1", 1.05)
        assert [(s.name, s.value, dict(s.labels)) for s in told] == [
            (STOPPED, 1.0, {"rank": "3", "node": "node1", "attempt": "0"})
        ]
        assert looks.look({3: (child.pid, 0)}, "node1", 1.5) == []  # not before a second
        assert [s.value for s in looks.look({3: (child.pid, 0)}, "node1", 2.1)] == [1.0]
        child.send_signal(signal.SIGCONT)
        time.sleep(0.2)
        assert [s.value for s in looks.look({3: (child.pid, 0)}, "node1", 2.3)] == [0.0]
        assert looks.look({3: (child.pid, 0)}, "node1", 2.4) == []
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait()


def test_a_rank_that_ends_while_stopped_is_cleared() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    looks = StopLooks()
    try:
        stop(child.pid)
        looks.look({0: (child.pid, 2)}, "node0", 0.0)
        assert [s.value for s in looks.look({0: (child.pid, 2)}, "node0", 0.1)] == [1.0]
    finally:
        child.kill()
        child.wait()
    assert [(s.value, s.labels["attempt"]) for s in looks.look({}, "node0", 0.2)] == [(0.0, "2")]


def test_a_stopped_rank_the_job_waits_for_is_one_hang_naming_it() -> None:
    hang = StoppedRankHang(world_size=4)
    stepping(hang, range(1, 11))  # steps of 0.1 s: the limit is its floor, 1 s
    hang.observe([stopped(2, 1.0)], attempt=0, now=1.05)
    assert hang.poll(1.9) == []
    found = hang.poll(2.1)
    assert [(f.kind, f.subject.rank, f.subject.node, f.severity.value) for f in found] == [
        ("hang", 2, "node1", "critical")
    ]
    assert found[0].evidence["stopped_rank_2"] == 1.0
    assert found[0].evidence["ranks_waiting"] == 3.0
    assert found[0].step == 11
    assert hang.poll(5.0) == []  # once


def test_a_stopped_rank_the_job_steps_without_is_no_hang() -> None:
    hang = StoppedRankHang(world_size=2)
    hang.observe([stopped(1, 1.0)], attempt=0, now=0.0)
    stepping(hang, range(1, 40))  # the job still steps: nobody waits for rank 1
    assert hang.poll(3.9) == []


def test_a_job_stopped_whole_is_suspended_not_hung() -> None:
    hang = StoppedRankHang(world_size=2)
    stepping(hang, range(1, 11))
    hang.observe([stopped(0, 1.0), stopped(1, 1.0)], attempt=0, now=1.0)
    assert hang.poll(30.0) == []


def test_a_rank_that_runs_again_or_belongs_to_another_attempt_is_no_hang() -> None:
    hang = StoppedRankHang(world_size=2)
    stepping(hang, range(1, 11))
    hang.observe([stopped(1, 1.0)], attempt=0, now=1.0)
    hang.observe([stopped(1, 0.0)], attempt=0, now=1.5)
    hang.observe([stopped(0, 1.0, attempt=1)], attempt=0, now=1.5)
    assert hang.poll(30.0) == []


def test_without_step_telemetry_a_stopped_rank_is_only_a_warning() -> None:
    hang = StoppedRankHang(world_size=2)
    hang.observe([stopped(1, 1.0)], attempt=0, now=0.0)
    found = hang.poll(1.5)
    assert [(f.kind, f.severity.value, f.subject.rank) for f in found] == [
        ("rank_stopped", "warn", 1)
    ]


def test_the_limit_scales_with_the_median_step() -> None:
    hang = StoppedRankHang(world_size=2, k=3.0, floor_s=1.0)
    for step in range(1, 6):
        hang.job_step(job(step, step_time=2.0), float(step) * 2)
    assert hang.limit_s() == 6.0
    hang.observe([stopped(1, 1.0)], attempt=0, now=10.5)
    assert hang.poll(16.0) == []
    assert [f.kind for f in hang.poll(16.6)] == ["hang"]
