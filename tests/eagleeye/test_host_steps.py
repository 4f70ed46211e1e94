"""An agent gathers its ranks' steps (``HostSteps``): a step goes out once every rank
reported it, or a later step did, or after ``wait_s``; in order, once per step; a sample
of a step already summarised joins the next one."""

from __future__ import annotations

from collector.types import Frame, Subject
from eagleeye.agents.ranktelemetry import HostSteps


def _frame(rank: int, step: int, **values: float) -> Frame:
    return Frame(Subject(0, rank, "node0"), step, 0.0, values)


def test_a_step_goes_out_once_every_rank_reported_it() -> None:
    steps = HostSteps(ranks=2, wait_s=30.0)
    steps.add(_frame(0, 5, step_time=0.5, collective_time=0.1), 0, 1.0)
    assert steps.ready(1.0) == []
    steps.add(_frame(1, 5, step_time=0.5, collective_time=0.2), 0, 1.1)
    (summary,) = steps.ready(1.1)
    assert (summary.step, summary.ranks) == (5, 2)
    assert summary.stat("compute_ms", "max") == 400.0  # the peer features added


def test_an_earlier_step_a_rank_missed_goes_out_first_when_a_later_one_is_complete() -> None:
    steps = HostSteps(ranks=2, wait_s=30.0)
    steps.add(_frame(0, 5, step_time=0.5), 0, 1.0)  # rank 1's report of step 5 never comes
    steps.add(_frame(0, 6, step_time=0.5), 0, 2.0)
    steps.add(_frame(1, 6, step_time=0.5), 0, 2.0)
    assert [(s.step, s.ranks) for s in steps.ready(2.0)] == [(5, 1), (6, 2)]


def test_a_sample_of_a_step_already_out_joins_the_next_step() -> None:
    steps = HostSteps(ranks=1, wait_s=30.0)
    steps.add(_frame(0, 5, step_time=0.5), 0, 1.0)
    assert [s.step for s in steps.ready(1.0)] == [5]
    steps.add(_frame(0, 5, gpu_temp=71.0), 0, 1.2)  # a GPU read labelled with step 5
    assert steps.ready(1.2) == []  # no second summary of step 5
    steps.add(_frame(0, 6, step_time=0.5), 0, 2.0)
    (summary,) = steps.ready(2.0)
    assert summary.step == 6
    assert summary.stat("gpu_temp", "median") == 71.0
    steps.add(_frame(0, 3, step_time=0.5), 1, 3.0)  # a new attempt counts its own steps
    assert [(s.step, s.attempt) for s in steps.ready(3.0)] == [(3, 1)]


def test_a_step_a_rank_never_ends_goes_out_after_the_wait() -> None:
    steps = HostSteps(ranks=2, wait_s=2.0)
    steps.add(_frame(0, 5, step_time=0.5), 0, 1.0)
    assert steps.ready(2.9) == []
    assert [s.ranks for s in steps.ready(3.0)] == [1]


def test_a_step_only_late_samples_joined_waits_for_its_reports() -> None:
    # GPU reads labelled with a step already out join the next one; they do not start its
    # wait, or a step of 3 s would go out with the reads alone and its reports be pushed on
    steps = HostSteps(ranks=1, wait_s=2.0)
    steps.add(_frame(0, 5, step_time=3.0), 0, 0.0)
    assert [s.step for s in steps.ready(0.0)] == [5]
    steps.add(_frame(0, 5, gpu_temp=70.0), 0, 0.5)
    assert steps.ready(2.9) == []
    steps.add(_frame(0, 6, step_time=3.0), 0, 3.0)
    (summary,) = steps.ready(3.0)
    assert (summary.step, summary.stat("gpu_temp", "median")) == (6, 70.0)
    assert summary.stat("step_time", "median") == 3.0
