"""The checkpoint action's outcome when no holder answers: a failed action is data."""

from __future__ import annotations

from datetime import timedelta

from ft_runtime.base import Runtime
from ft_runtime.ckpt import CheckpointRuntime
from ft_runtime.types import Action, ActionKind, OutcomeStatus
from tests.ft_runtime.ckpt.conftest import make_ring


def test_unreachable_holders_give_a_failed_outcome_not_an_exception() -> None:
    rt = CheckpointRuntime(make_ring(2), timeout=timedelta(milliseconds=200), clock=lambda: 5.0)
    assert isinstance(rt, Runtime)
    out = rt.execute(Action(ActionKind.CHECKPOINT, "job", "xid 79", "ckpt/9"))
    assert out.status == OutcomeStatus.FAILED
    assert "node0" in out.detail
    assert "node1" in out.detail
    assert "did not answer" in out.detail
    assert out.time == 5.0
