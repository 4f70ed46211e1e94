"""The exchange with two ranks per replica and a gradient whose size the replica size
does not divide (the slices differ by one element): one process, ranks on threads."""

from __future__ import annotations

import threading

import pytest
import torch

from ft_runtime.ftar import ReplicaComm
from ft_runtime.quorum import QuorumService
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.store import connect

pytestmark = pytest.mark.timeout(120)


def test_an_odd_sized_gradient_is_averaged_over_replicas_and_ranks() -> None:
    quorum = QuorumService(replicas=2, replica_size=2)
    quorum.start()
    secret = JobSecret(quorum.secret)
    out: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def rank(global_rank: int) -> None:
        replica, replica_rank = divmod(global_rank, 2)
        comm = None
        try:
            comm = ReplicaComm(
                connect(quorum.address, secret),
                quorum.address,
                replica=replica,
                replica_rank=replica_rank,
                replica_size=2,
                num_replicas=2,
            )
            flat = torch.arange(5, dtype=torch.float32) * (global_rank + 1)
            comm.exchange(flat, step=0, batch=0)
            out[global_rank] = flat
        except BaseException as exc:
            errors.append(exc)
        finally:
            if comm is not None:
                comm.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    quorum.close()
    assert not errors, errors
    expected = torch.arange(5, dtype=torch.float32) * (1 + 2 + 3 + 4) / 4
    for r in range(4):
        assert torch.equal(out[r], expected), (r, out[r])
