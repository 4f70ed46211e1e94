"""A rank blocked while its peers wait in a collective, across hosts: what an agent
reports of its ranks' progress (only when its host stalls) and how the controller judges
it (one hang on the rank that never entered and whose process is idle or blocked, the
waiting ranks in the evidence; nothing on a busy rank, nor when every rank waits, pauses
or reports no collective)."""

from __future__ import annotations

import subprocess
import sys
import time

from collector.types import JOB, Frame, Sample, Subject
from detectors.progress import HangLimits
from eagleeye.agents.waits import CollectiveWaitHang, RankProgress

# 0.1 s steps: a 2 s silence limit, reports at 1 s; idle 3 s, blocked 4 s
LIMITS = HangLimits(k=10.0, min_silence_s=2.0, idle_s=3.0, blocked_s=4.0)


def _mark(rank: int, name: str, value: float, step: int | None, attempt: int = 0) -> Sample:
    return Sample(name, value, 0.0, {"rank": str(rank), "attempt": str(attempt)}, step)


def _stepping(progress: RankProgress, ranks: list[int], steps: range, start: float) -> float:
    now = start
    for step in steps:
        now += 0.1
        progress.observe([_mark(r, "step_time", 0.1, step) for r in ranks], now)
        assert progress.report(now, ranks) == []  # a job in health: nothing
    return now


def test_an_agent_reports_its_ranks_only_when_its_host_stalls() -> None:
    progress = RankProgress("node1", 0, [2, 3], LIMITS, now=0.0)
    assert progress.report(100.0, [2, 3]) == []  # before any step: nothing to time it by
    progress.observe([Sample("step_time", 0.1, 0.0, {"rank": "²", "attempt": "0"}, 0)], 100.0)
    progress.observe([_mark(2, "step_time", 0.1, 0)], 100.0)
    assert progress.report(100.0, [2, 3]) == []  # rank 3 launched long ago, yet starting
    now = _stepping(progress, [2, 3], range(1, 20), 100.0)
    progress.observe([_mark(3, "in_collective", 0.1, 19)], now + 0.2)  # 3 waits, 2 blocks
    assert progress.report(now + 0.9, [2, 3]) == []
    sent = progress.report(now + 1.1, [2, 3])
    assert sorted((s.name, s.labels["rank"], s.step) for s in sent) == [
        ("progress.running", "2", 19),
        ("progress.waiting", "3", 19),
    ]
    assert all(s.labels["node"] == "node1" and s.labels["attempt"] == "0" for s in sent)
    assert progress.report(now + 1.5, [2, 3]) == []  # unchanged: said once
    progress.observe([_mark(2, "pause", 1.0, 19)], now + 1.6)
    assert [s.name for s in progress.report(now + 1.7, [2, 3])] == [
        "progress.paused",
        "progress.waiting",
    ]
    progress.observe([_mark(2, "pause", 0.0, 19), _mark(3, "in_collective", 0.0, 19)], now + 2)
    progress.observe([_mark(r, "step_time", 0.1, 20) for r in (2, 3)], now + 2.1)
    over = progress.report(now + 2.1, [2, 3])  # the stall is over: said once
    assert sorted((s.name, s.step) for s in over) == [("progress.running", 20)] * 2
    assert progress.report(now + 2.2, [2, 3]) == []
    other_attempt = [_mark(2, "in_collective", 5.0, 20, attempt=1)]
    progress.observe(other_attempt, now + 2.3)  # not this attempt's ranks
    assert progress.report(now + 2.4, [2, 3]) == []
    assert progress.reports == 3


def _job(judge: CollectiveWaitHang, steps: range, start: float) -> float:
    now = start
    for step in steps:
        now += 0.1
        judge.job_step(Frame(JOB, step, now, {"step_time.median": 0.1}), now)
        assert judge.poll(now) == []
    return now


def _state(rank: int, state: str, step: int, node: str = "node0") -> Sample:
    labels = {"rank": str(rank), "node": node, "attempt": "0"}
    return Sample(f"progress.{state}", 1.0, 0.0, labels, step)


def _look(rank: int, cpu_s: float, step: int, blocked: float = 0.0) -> list[Sample]:
    labels = {"rank": str(rank), "node": "node1", "attempt": "0"}
    return [
        Sample("proc_cpu_s", cpu_s, 0.0, labels, step),
        Sample("proc_blocked", blocked, 0.0, labels, step),
    ]


def test_the_rank_that_never_entered_is_the_one_hang_with_the_waiting_ranks() -> None:
    judge = CollectiveWaitHang(4, LIMITS)
    now = _job(judge, range(10), 0.0)  # the job's last step arrived at `now`
    reports = [_state(0, "waiting", 9), _state(1, "waiting", 9), _state(3, "waiting", 9, "node1")]
    judge.observe([*reports, _state(2, "running", 9, "node1"), *_look(2, 7.5, 9)], 0, now + 1.0)
    judge.observe(_look(2, 7.5, 9), 0, now + 2.0)  # its main thread gains no CPU time
    assert judge.poll(now + 3.9) == []  # within idle_s of the first look
    (found,) = judge.poll(now + 4.1)
    assert (found.kind, found.subject, found.severity.value) == (
        "hang",
        Subject(rank=2, node="node1"),
        "critical",
    )
    ev = found.evidence
    assert (ev["culprit_rank_0"], ev["ranks_waiting"], ev["limit_s"]) == (2.0, 3.0, 2.0)
    assert (ev["idle"], ev["idle_limit_s"], ev["culprit_cpu_s_0"]) == (1.0, 3.0, 7.5)
    assert round(ev["idle_s"], 3) == round(ev["culprit_idle_s_0"], 3) == 3.1
    assert "blocked" not in ev
    assert [ev[f"waiting_rank_{i}"] for i in range(3)] == [0.0, 1.0, 3.0]
    assert found.step == 10
    assert judge.poll(now + 5.0) == []  # one finding per stall


def test_a_busy_rank_is_working_however_long_and_one_without_looks_is_no_culprit() -> None:
    judge = CollectiveWaitHang(3, LIMITS)
    now = _job(judge, range(10), 0.0)
    judge.observe([_state(0, "waiting", 9), _state(1, "running", 9, "node1")], 0, now + 1.0)
    judge.observe([_state(2, "running", 9, "node1")], 0, now + 1.0)  # its host cannot look
    for second in range(1, 60):  # a checkpoint save on rank 1, not declared as a pause
        judge.observe(_look(1, 2.0 + second, 9), 0, now + second)
        assert judge.poll(now + second + 0.5) == []
    judge.observe(_look(1, 62.0, 9), 0, now + 60.0)  # then it gains no more CPU time
    judge.observe(_look(1, 62.0, 9), 0, now + 61.0)
    assert judge.poll(now + 62.9) == []
    (found,) = judge.poll(now + 63.1)
    assert (found.subject.rank, found.evidence["culprit_cpu_s_0"]) == (1, 62.0)
    assert round(found.evidence["idle_s"], 3) == 3.1


def test_a_rank_in_uninterruptible_sleep_without_cpu_time_is_blocked() -> None:
    judge = CollectiveWaitHang(
        2, HangLimits(k=10.0, min_silence_s=2.0, idle_s=600.0, blocked_s=4.0)
    )
    now = _job(judge, range(10), 0.0)
    judge.observe([_state(0, "waiting", 9), _state(1, "running", 9, "node1")], 0, now + 1.0)
    judge.observe(_look(1, 5.0, 9, blocked=1.0), 0, now + 1.0)  # state D
    judge.observe(_look(1, 5.5, 9, blocked=1.0), 0, now + 2.0)  # D, yet it gained CPU time
    assert judge.poll(now + 5.9) == []  # blocked 3.9 s since its last CPU gain
    (found,) = judge.poll(now + 6.1)
    ev = found.evidence
    assert (found.subject.rank, ev["blocked"], ev["blocked_limit_s"]) == (1, 1.0, 4.0)
    assert round(ev["blocked_s"], 3) == 4.1
    assert "idle" not in ev  # idle 4.1 s of its 600 s
    judge = CollectiveWaitHang(
        2, HangLimits(k=10.0, min_silence_s=2.0, idle_s=600.0, blocked_s=4.0)
    )
    now = _job(judge, range(10), 0.0)
    judge.observe([_state(0, "waiting", 9), _state(1, "running", 9, "node1")], 0, now + 1.0)
    for second in range(1, 30):  # in and out of D (reading a checkpoint), gaining CPU time
        judge.observe(_look(1, float(second), 9, blocked=1.0), 0, now + second)
        assert judge.poll(now + second + 0.5) == []


def test_a_wait_or_a_pause_that_ends_is_progress_and_a_paused_rank_no_culprit() -> None:
    judge = CollectiveWaitHang(2, LIMITS)
    now = _job(judge, range(10), 0.0)
    judge.observe([_state(0, "waiting", 9), _state(1, "paused", 9)], 0, now + 1.0)
    assert judge.poll(now + 30.0) == []  # a long validation on rank 1: no culprit
    judge.observe([_state(1, "running", 9), *_look(1, 4.0, 9)], 0, now + 30.0)  # pause over
    assert judge.poll(now + 32.9) == []
    assert [f.subject.rank for f in judge.poll(now + 33.1)] == [1]  # then it never came, idle


def test_a_job_that_waits_whole_is_reported_and_one_where_nobody_waits_is_not() -> None:
    judge = CollectiveWaitHang(2, LIMITS)
    now = _job(judge, range(10), 0.0)
    judge.observe([_state(0, "paused", 9), _state(1, "paused", 9)], 0, now + 1.0)
    assert judge.poll(now + 60.0) == []  # every rank paused
    judge.observe([_state(0, "waiting", 9), _state(1, "waiting", 9)], 0, now + 61.0)
    (stall,) = judge.poll(now + 62.0)
    assert (stall.kind, stall.subject, stall.severity.value) == ("collective_stall", JOB, "warn")
    assert judge.poll(now + 63.0) == []
    now = _job(judge, range(10, 12), now + 64.0)  # the job went on: stale words dropped
    assert judge.poll(now + 60.0) == []


def test_no_verdict_before_a_step_on_a_stopped_rank_or_a_rank_that_exited() -> None:
    judge = CollectiveWaitHang(2, LIMITS)
    judge.observe([_state(0, "waiting", 0), _state(1, "running", 0)], 0, 1.0)
    assert judge.poll(100.0) == []  # no step of the job yet
    now = _job(judge, range(10), 100.0)
    judge.observe([_state(0, "waiting", 9), _state(1, "running", 9)], 0, now + 1.0)
    stopped = Sample("proc_stopped", 1.0, 0.0, {"rank": "1", "attempt": "0"})
    judge.observe([stopped], 0, now + 1.0)
    assert judge.poll(now + 10.0) == []  # a stopped rank is StoppedRankHang's
    judge.observe([Sample("proc_stopped", 0.0, 0.0, {"rank": "1", "attempt": "0"})], 0, now + 10)
    judge.exited(1)  # its exit is a finding of its own: the one left waits, no hang
    assert [f.kind for f in judge.poll(now + 20.0)] == ["collective_stall"]
    judge.observe([_state(1, "running", 9)], 1, now + 20.0)  # another attempt's word
    assert judge.poll(now + 30.0) == []


def test_an_agent_looks_at_its_running_ranks_main_threads_while_its_host_stalls() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        progress = RankProgress("node1", 0, [0, 1, 2], LIMITS, now=0.0)
        pids = {0: busy.pid, 1: asleep.pid, 2: asleep.pid}
        now = _stepping(progress, [0, 1, 2], range(20), 100.0)
        progress.observe([_mark(2, "in_collective", 0.1, 19)], now + 0.2)
        looks: list[Sample] = []
        for tick in range(1, 16):  # the host has stalled; it looks each 0.2 s for 3 s
            time.sleep(0.2)
            sent = progress.report(now + 1.0 + 0.2 * tick, [0, 1, 2], pids)
            looks += [s for s in sent if s.name.startswith("proc_")]
            states = {(s.name, s.labels["rank"]) for s in sent if s.name.startswith("progress.")}
            if tick == 1:  # the first report: the states, a look at each running rank
                assert states == {
                    ("progress.running", "0"),
                    ("progress.running", "1"),
                    ("progress.waiting", "2"),
                }
            else:
                assert states == set()  # unchanged: said once
        cpu = {r: [s.value for s in looks if s.name == "proc_cpu_s" and s.labels["rank"] == r]
               for r in ("0", "1")}  # fmt: skip
        assert "2" not in {s.labels["rank"] for s in looks}  # a waiting rank: no look
        assert len(cpu["1"]) == 1  # asleep: one look, its CPU time never changes
        assert len(cpu["0"]) >= 2  # busy: looked at again (once a second at most), growing
        assert cpu["0"] == sorted(cpu["0"])
        assert cpu["0"][-1] > cpu["0"][0]
        assert {s.value for s in looks if s.name == "proc_blocked"} == {0.0}
    finally:
        for proc in (busy, asleep):
            proc.kill()
            proc.wait()


def test_a_report_on_no_rank_of_the_job_is_ignored_and_never_a_culprit() -> None:
    judge = CollectiveWaitHang(4, LIMITS)
    now = _job(judge, range(10), 0.0)
    waiting = [_state(r, "waiting", 9) for r in range(4)]
    odd = Sample("progress.running", 1.0, 0.0, {"rank": "²", "attempt": "0"}, 9)
    judge.observe([odd], 0, now + 1.0)  # "²".isdigit() holds: no crash of the controller
    judge.observe([*waiting, _state(9, "running", 9, "node1"), *_look(9, 7.5, 9)], 0, now + 1.0)
    (found,) = judge.poll(now + 5.0)  # rank 9 is no rank of a 4-rank job: the job waits whole
    assert (found.kind, found.subject) == ("collective_stall", JOB)
    assert found.evidence["ranks_unknown"] == 0.0
