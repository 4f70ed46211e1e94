from __future__ import annotations

from collector.types import Frame, Subject
from detectors.progress import ProgressStall

R0, R1 = Subject(rank=0), Subject(rank=1)


def feed_steps(detector: ProgressStall, clock, steps: int, step_time: float = 0.1) -> None:
    for step in range(steps):
        clock.advance(step_time)
        for subject in (R0, R1):
            detector.process(Frame(subject, step, clock(), {"step_time": step_time}))


def test_a_rank_that_stops_stepping_is_hung_after_k_median_steps(clock) -> None:
    detector = ProgressStall(k=10, min_silence_s=0.5)
    feed_steps(detector, clock, 20)
    clock.advance(0.9)
    detector.process(Frame(R0, 20, clock(), {"step_time": 0.1}))  # rank 0 goes on
    assert detector.poll(clock()) == []
    clock.advance(0.2)  # rank 1 silent for 1.1 s > 10 × 0.1 s
    (finding,) = detector.poll(clock())
    assert finding.kind == "hang"
    assert finding.subject == R1
    assert finding.step == 19
    assert finding.evidence["silence_s"] > finding.evidence["limit_s"] == 1.0
    later = detector.poll(clock() + 5)  # rank 0 has gone silent too by then
    assert [f.subject for f in later] == [R0]  # one finding per stall, not one per tick


def test_startup_gets_its_grace_and_an_exit_ends_tracking(clock) -> None:
    detector = ProgressStall(k=10, min_silence_s=0.5, startup_grace_s=30)
    feed_steps(detector, clock, 20)
    detector.process(Frame(R1, None, clock(), {"launched": 1.0}))
    clock.advance(10)
    assert [f.subject for f in detector.poll(clock())] == [R0]  # R1 is still starting
    detector.process(Frame(R1, None, clock(), {"exit_code": -9.0}))
    clock.advance(60)
    assert detector.poll(clock()) == []


def test_the_limit_follows_the_median_not_a_slow_outlier(clock) -> None:
    detector = ProgressStall(k=5, min_silence_s=0.1)
    feed_steps(detector, clock, 30, step_time=0.2)
    detector.process(Frame(R0, 31, clock(), {"step_time": 30.0}))  # one very slow step
    assert detector.silence_limit() == 1.0


def test_the_rank_its_peers_wait_for_is_found_though_they_went_silent_first(clock) -> None:
    detector = ProgressStall(k=10, min_silence_s=0.5)
    feed_steps(detector, clock, 20)
    # Rank 0 reported its last step a little before rank 1 did, then waited for rank 1.
    detector.process(Frame(R0, 20, clock() - 0.05, {"step_time": 0.1}))
    detector.process(Frame(R0, 20, clock() + 0.3, {"in_collective": 0.3}))
    clock.advance(1.02)  # rank 0 silent for 1.07 s, rank 1 for 1.02 s: both past 1.0 s
    (finding,) = detector.poll(clock())
    assert finding.subject == R1
    assert finding.evidence["waiting_in_collective"] == 0.0
    assert finding.evidence["ranks_waiting"] == 1.0


def test_when_every_silent_rank_waits_in_the_collective_they_fire_late(clock) -> None:
    detector = ProgressStall(k=10, min_silence_s=0.5, waiting_factor=2.0)
    feed_steps(detector, clock, 20)
    for subject in (R0, R1):
        detector.process(Frame(subject, 20, clock(), {"in_collective": 1.0}))
    clock.advance(1.5)
    assert detector.poll(clock()) == []
    clock.advance(0.6)
    findings = detector.poll(clock())
    assert {f.subject for f in findings} == {R0, R1}
    assert all(f.evidence["limit_s"] == 2.0 for f in findings)


def test_a_wait_that_ended_no_longer_counts(clock) -> None:
    detector = ProgressStall(k=10, min_silence_s=0.5)
    feed_steps(detector, clock, 20)
    detector.process(Frame(R0, 20, clock(), {"in_collective": 1.0}))
    detector.process(Frame(R0, 20, clock(), {"in_collective": 0.0}))
    clock.advance(1.1)
    assert {f.subject for f in detector.poll(clock())} == {R0, R1}


def test_a_rank_that_closed_its_session_gets_the_grace_to_exit(clock) -> None:
    detector = ProgressStall(k=10, min_silence_s=0.5, startup_grace_s=30)
    feed_steps(detector, clock, 20)
    detector.process(Frame(R1, 19, clock(), {"closing": 1.0}))
    clock.advance(5)
    (finding,) = detector.poll(clock())  # rank 0 still trains, so its silence is a hang
    assert finding.subject == R0
    clock.advance(26)
    (late,) = detector.poll(clock())  # a shut-down that outlasts the grace is one too
    assert late.subject == R1
    assert late.step == 19
