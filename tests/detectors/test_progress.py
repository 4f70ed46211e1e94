"""The progress detector judges a hang on evidence only: silence alone never fires."""

from __future__ import annotations

import pytest

from collector.types import JOB, Frame, Subject
from detectors.config import from_mapping
from detectors.errors import DetectorError
from detectors.progress import HangLimits, ProgressStall

R0, R1, R2 = Subject(0, 0, "n0"), Subject(0, 1, "n0"), Subject(0, 2, "n1")
RANKS = (R0, R1, R2)


def feed_steps(detector: ProgressStall, clock, steps: int, step_time: float = 0.1) -> None:
    for step in range(steps):
        clock.advance(step_time)
        for subject in RANKS:
            detector.process(Frame(subject, step, clock(), {"step_time": step_time}))


def look(detector: ProgressStall, subject: Subject, now: float, state: str = "S", cpu=1.0):
    """One look at a rank's /proc entry, as the controller sends it."""
    values = {"proc_stopped": float(state == "T"), "proc_blocked": float(state == "D")}
    values["proc_cpu_s"] = cpu
    detector.process(Frame(subject, None, now, values))


def wait(detector: ProgressStall, subject: Subject, now: float, waited: float) -> None:
    detector.process(Frame(subject, None, now, {"in_collective": waited}))


def test_silence_alone_never_fires_however_long(clock) -> None:
    detector = ProgressStall()
    for subject in RANKS:  # launched, never a step (a script with no telemetry)
        detector.process(Frame(subject, None, clock(), {"launched": 1.0}))
    clock.advance(3600)
    assert detector.poll(clock()) == []
    assert set(detector.progress(clock()).values()) == {"unknown"}
    feed_steps(detector, clock, 20)
    clock.advance(3600)  # an hour without a step, nobody waiting, nothing stopped
    assert detector.poll(clock()) == []
    assert set(detector.progress(clock()).values()) == {"stepping"}


def test_a_stopped_rank_is_the_culprit_and_its_waiting_peers_are_its_evidence(clock) -> None:
    detector = ProgressStall(stopped_k=2.0, stopped_s=0.1)
    feed_steps(detector, clock, 20)  # median step 0.1 s: stopped for 0.2 s is a hang
    look(detector, R1, clock(), "T")
    wait(detector, R0, clock() + 0.05, 0.05)
    wait(detector, R2, clock() + 0.05, 0.05)
    clock.advance(0.15)
    look(detector, R1, clock(), "T")
    assert detector.poll(clock()) == []  # stopped for 0.15 s < 2 median steps
    clock.advance(0.06)
    (finding,) = detector.poll(clock())
    assert (finding.kind, finding.subject, finding.step) == ("hang", R1, 19)
    evidence = finding.evidence
    assert evidence["stopped"] == 1.0
    assert evidence["stopped_s"] == pytest.approx(0.21)
    assert evidence["limit_s"] == pytest.approx(0.2)
    assert evidence["culprit_rank_0"] == 1.0
    assert (evidence["waiting_rank_0"], evidence["waiting_rank_1"]) == (0.0, 2.0)
    assert evidence["ranks_waiting"] == 2.0
    assert evidence["progress_unknown"] == 0.0
    clock.advance(30)
    assert detector.poll(clock()) == []  # one finding per incident, never the waiting ranks
    assert detector.progress(clock())[R1] == "stopped"
    assert detector.progress(clock())[R0] == "waiting"


def test_a_stopped_rank_without_any_step_is_found_with_unknown_progress(clock) -> None:
    detector = ProgressStall(stopped_s=0.5)
    for subject in (R0, R1):
        detector.process(Frame(subject, None, clock(), {"launched": 1.0}))
    look(detector, R0, clock(), "T")
    look(detector, R1, clock(), "S")
    clock.advance(0.6)
    (finding,) = detector.poll(clock())
    assert finding.subject == R0
    assert finding.evidence["progress_unknown"] == 1.0
    assert "last_step" not in finding.evidence


def test_every_rank_stopped_at_once_is_a_suspended_job_not_a_hang(clock) -> None:
    detector = ProgressStall(stopped_s=0.1)
    feed_steps(detector, clock, 5)
    for subject in RANKS:
        look(detector, subject, clock(), "T")
    clock.advance(10)
    assert detector.poll(clock()) == []


def test_a_stop_shorter_than_the_limit_is_forgotten_when_the_rank_runs_again(clock) -> None:
    detector = ProgressStall(stopped_k=2.0, stopped_s=0.1)
    feed_steps(detector, clock, 20)
    look(detector, R1, clock(), "T")
    clock.advance(0.15)
    look(detector, R1, clock(), "R")  # a SIGCONT: a duty cycle of a slowdown
    clock.advance(0.15)
    look(detector, R1, clock(), "T")
    clock.advance(0.1)
    assert detector.poll(clock()) == []


def test_uninterruptible_sleep_without_cpu_time_is_a_hang_unless_paused(clock) -> None:
    detector = ProgressStall(blocked_s=30.0)
    feed_steps(detector, clock, 20)
    look(detector, R2, clock(), "D", cpu=5.0)
    clock.advance(20)
    look(detector, R2, clock(), "D", cpu=5.5)  # it ran meanwhile: the 30 s start again
    clock.advance(29)
    look(detector, R2, clock(), "D", cpu=5.5)
    assert detector.poll(clock()) == []
    detector.process(Frame(R0, 20, clock(), {"pause": 1.0}))
    look(detector, R0, clock(), "D", cpu=1.0)
    clock.advance(2)
    (finding,) = detector.poll(clock())
    assert (finding.subject, finding.evidence["blocked"]) == (R2, 1.0)
    clock.advance(60)
    assert detector.poll(clock()) == []  # R0 declared a pause (a checkpoint save)


def test_an_idle_rank_its_peers_wait_for_is_hung_a_busy_or_paused_one_never(clock) -> None:
    detector = ProgressStall(idle_s=60.0, min_silence_s=1.0)
    feed_steps(detector, clock, 20)
    start = clock()
    wait(detector, R0, start, 0.5)
    detector.process(Frame(R2, 19, start, {"pause": 1.0}))  # R2 evaluates, declared
    for second in range(120):  # R1 computes for two minutes: its CPU time grows
        look(detector, R1, start + second, "R", cpu=float(second))
        look(detector, R2, start + second, "S", cpu=1.0)
        assert detector.poll(start + second) == []
    now = start + 120
    for second in range(61):  # then its main thread stops running (a deadlock)
        look(detector, R1, now + second, "S", cpu=119.0)
    (finding,) = detector.poll(now + 61)
    assert (finding.subject, finding.evidence["idle"]) == (R1, 1.0)
    assert finding.evidence["waiting_rank_0"] == 0.0
    assert finding.evidence["idle_s"] == pytest.approx(62.0)


def test_a_collective_every_rank_waits_in_for_too_long_never_completes(clock) -> None:
    detector = ProgressStall(collective_s=30.0)
    feed_steps(detector, clock, 20)
    for subject in RANKS:
        wait(detector, subject, clock(), 1.0)
    clock.advance(28.5)
    assert detector.poll(clock()) == []
    clock.advance(1)
    (finding,) = detector.poll(clock())
    assert finding.subject == JOB
    assert finding.evidence["collective_never_completes"] == 1.0
    assert finding.evidence["ranks_waiting"] == 3.0
    assert detector.poll(clock() + 100) == []
    detector.process(Frame(R0, 0, clock(), {"in_collective": 0.0}))  # one got out of it
    assert detector.poll(clock() + 200) == []


def test_exits_leave_relaunches_start_afresh_and_a_job_restart_forgets_step_times(clock) -> None:
    detector = ProgressStall(stopped_k=2.0, stopped_s=0.1)
    feed_steps(detector, clock, 20, step_time=1.0)
    assert detector.stopped_limit() == 2.0
    detector.process(Frame(JOB, None, clock(), {"job_restart": 1.0}))
    assert detector.stopped_limit() == 0.1
    look(detector, R1, clock(), "T")
    detector.process(Frame(R1, None, clock(), {"exit_code": -9.0}))
    clock.advance(5)
    assert detector.poll(clock()) == []
    detector.process(Frame(R1, None, clock(), {"launched": 1.0}))
    assert detector.progress(clock())[R1] == "unknown"


def test_a_closed_rank_is_not_idle_but_a_stopped_one_is_still_found(clock) -> None:
    detector = ProgressStall(idle_s=1.0, min_silence_s=0.5, stopped_s=0.1)
    feed_steps(detector, clock, 20)
    wait(detector, R0, clock(), 0.5)
    detector.process(Frame(R1, 19, clock(), {"closing": 1.0}))
    look(detector, R1, clock(), "S")
    clock.advance(5)
    look(detector, R1, clock(), "S")
    look(detector, R2, clock(), "T")
    clock.advance(0.2)
    (finding,) = detector.poll(clock())
    assert finding.subject == R2


def test_limits_come_from_the_hang_table_and_bad_ones_are_refused() -> None:
    config = from_mapping({"hang": {"stopped_s": 0.5, "idle_s": 30}})
    assert config.hang == HangLimits(stopped_s=0.5, idle_s=30)
    with pytest.raises(DetectorError, match="unknown hang limit.*known: k, min_silence_s"):
        from_mapping({"hang": {"startup_grace_s": 120}})
    with pytest.raises(DetectorError, match="stopped_s must be a number above 0"):
        HangLimits(stopped_s=0)
