"""``OptimizerWrapper.step(closure)``, the form frameworks call (Lightning's strategy): the
closure computes the gradient first, its loss is returned, and replicas stay bitwise equal
to replicas that step without one."""

from __future__ import annotations

import threading

import pytest
import torch

from ft_runtime.quorum import QuorumService
from tests.ft_runtime.replica.test_manager import Rank, guarded

pytestmark = pytest.mark.timeout(180)
STEPS = 8


def train(rank: Rank, with_closure: bool, losses: list[float]) -> None:
    while rank.manager.step < STEPS:
        for x, y in rank.loader:

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                rank.optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(rank.model(x), y)
                loss.backward()
                return loss

            if with_closure:
                losses.append(float(rank.optimizer.step(closure).detach()))
            else:
                closure()
                assert rank.optimizer.step() is True
            if rank.manager.step >= STEPS:
                return


def test_a_closure_step_trains_as_a_plain_step() -> None:
    quorum = QuorumService(replicas=2, replica_size=1)
    quorum.start()
    ranks = [Rank(quorum, r) for r in range(2)]
    errors: list[BaseException] = []
    losses: list[float] = []
    threads = [
        threading.Thread(target=guarded(errors, lambda r=r, c=c: train(r, c, losses)))
        for r, c in zip(ranks, (True, False), strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert not errors, errors
        assert len(losses) == STEPS
        assert all(loss > 0 for loss in losses)
        assert torch.equal(ranks[0].params(), ranks[1].params())
    finally:
        for rank in ranks:
            rank.manager.close()
        quorum.close()
