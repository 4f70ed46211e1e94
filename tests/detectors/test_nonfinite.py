"""A NaN is named at its root rank, not at the first rank to report it."""

from __future__ import annotations

import math

from collector.types import Frame, Subject
from detectors.nonfinite import NonFiniteLoss
from detectors.stepbatch import StepBatch
from detectors.types import Finding

NAN = math.nan


def _frame(rank: int, step: int, time: float, **values: float) -> Frame:
    return Frame(Subject(0, rank, f"n{rank // 2}"), step, time, values)


def _warm(det: NonFiniteLoss, ranks: int = 4) -> None:
    for rank in range(ranks):
        det.process(_frame(rank, 0, 0.0, loss=2.0, grad_norm=1.0))


def _feed(det: NonFiniteLoss, frames: list[Frame]) -> list[Finding]:
    return [f for frame in frames for f in det.process(frame)]


def test_the_rank_whose_loss_broke_is_named_though_another_reported_first() -> None:
    det = NonFiniteLoss()
    _warm(det)
    # The all-reduce spread rank 2's NaN loss into every rank's gradient norm.
    order = [3, 1, 2, 0]
    frames = [
        _frame(r, 1, 1.0 + 0.01 * i, loss=NAN if r == 2 else 2.0, grad_norm=NAN)
        for i, r in enumerate(order)
    ]
    found = _feed(det, frames)
    assert [(f.kind, f.subject.rank) for f in found] == [("nan", 2)]
    evidence = found[0].evidence
    assert evidence["ranks_affected"] == 4.0
    assert sorted(evidence[f"affected_rank_{i}"] for i in range(3)) == [0.0, 1.0, 3.0]
    assert math.isnan(evidence["loss"])


def test_a_rank_whose_own_gradient_broke_before_the_all_reduce_is_the_root() -> None:
    det = NonFiniteLoss()
    _warm(det)
    frames = [
        _frame(r, 1, 1.0, loss=2.0, grad_norm=NAN, grad_norm_local=NAN if r == 1 else 1.0)
        for r in range(4)
    ]
    (found,) = _feed(det, frames)
    assert found.subject.rank == 1
    assert found.evidence["ranks_nonfinite_own"] == 1.0


def test_a_broken_own_gradient_outranks_a_loss_its_tensor_parallel_group_shares() -> None:
    # Ranks 0-3 are one tensor-parallel group: one loss, NaN on all four once rank 3's
    # own gradient broke; rank 0 reports first.
    det = NonFiniteLoss()
    _warm(det)
    frames = [
        _frame(
            r, 1, 1.0 + 0.01 * r, loss=NAN, grad_norm=NAN, grad_norm_local=NAN if r == 3 else 1.0
        )
        for r in range(4)
    ]
    (found,) = _feed(det, frames)
    assert found.subject.rank == 3
    assert found.evidence["ranks_nonfinite_own"] == 4.0


def test_when_no_rank_s_own_value_broke_the_job_is_named() -> None:
    det = NonFiniteLoss()
    _warm(det)
    (found,) = _feed(det, [_frame(r, 1, 1.0, loss=2.0, grad_norm=NAN) for r in range(4)])
    assert found.subject.scope == "job"
    assert found.evidence["root_unknown"] == 1.0


def test_a_silent_rank_does_not_hold_the_verdict_past_the_wait() -> None:
    det = NonFiniteLoss(wait_s=2.0)
    _warm(det)
    assert _feed(det, [_frame(r, 1, 1.0, loss=NAN, grad_norm=NAN) for r in (0, 1, 2)]) == []
    assert det.poll(2.5) == []
    (found,) = det.poll(3.1)
    assert found.subject.rank == 0  # the earliest of the ranks whose loss broke


def test_an_exited_rank_is_not_waited_for() -> None:
    det = NonFiniteLoss(wait_s=100.0)
    _warm(det)
    det.process(Frame(Subject(0, 3, "n1"), None, 0.5, {"exit_code": -9.0}))
    found = _feed(det, [_frame(r, 1, 1.0, loss=NAN if r == 1 else 2.0) for r in (0, 1, 2)])
    assert [f.subject.rank for f in found] == [1]


def test_a_nan_that_repeats_every_step_is_named_once() -> None:
    det = NonFiniteLoss(clear_steps=20)
    _warm(det, ranks=2)
    found = []
    for step in range(1, 30):
        found += _feed(det, [_frame(r, step, float(step), loss=NAN) for r in (0, 1)])
    assert [(f.subject.rank, f.step) for f in found] == [(0, 1), (0, 21)]


def test_a_whole_step_gives_the_same_verdict() -> None:
    frames = [_frame(r, 5, 1.0, loss=NAN if r == 3 else 2.0, grad_norm=NAN) for r in range(4)]
    (found,) = NonFiniteLoss().process_step(StepBatch.from_frames(frames))
    assert found.subject.rank == 3
    assert found.evidence["ranks_affected"] == 4.0


def test_gradients_broken_a_step_after_a_rank_s_own_loss_are_its_spread() -> None:
    # A trace may have the other ranks' NaN gradient norm one observation after the
    # culprit's NaN loss: that is the same fault, not a second one on the job. Once
    # clear_steps have passed, a job-wide NaN gradient is a finding again.
    det = NonFiniteLoss(clear_steps=20)
    _warm(det)
    found = _feed(det, [_frame(r, 1, 1.0, loss=NAN if r == 2 else 2.0) for r in range(4)])
    found += _feed(det, [_frame(r, 2, 2.0, loss=2.0, grad_norm=NAN) for r in range(4)])
    assert [(str(f.subject), f.step) for f in found] == [("rank 2", 1)]
    later = _feed(det, [_frame(r, 30, 30.0, loss=2.0, grad_norm=NAN) for r in range(4)])
    assert [(f.subject.scope, f.step) for f in later] == [("job", 30)]
