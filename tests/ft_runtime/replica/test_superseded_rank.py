"""A rank that was cut off from the quorum's store while its replica was dropped and a
later incarnation admitted in its place: when it reaches the store again, it ends instead
of exchanging as that replica.

Real pieces: the quorum service hosting a real TCPStore and the real rank side
(``ReplicaComm``). The order is forced: the old rank is made in epoch 0 and then makes no
call (its link is down) while the coordinator drops its replica (epoch 1) and admits
incarnation 1 (epoch 2, joining); replica 0 is then dropped too (epoch 3: replica 1
alone), so that an exchange the old rank wrongly takes part in completes at once instead
of waiting for peers.
"""

from __future__ import annotations

import pytest
import torch

from ft_runtime.errors import LeftQuorum
from ft_runtime.ftar import ReplicaComm
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import protocol as p
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.store import connect

pytestmark = pytest.mark.timeout(120)


def test_a_rank_whose_replica_was_dropped_and_readmitted_meanwhile_leaves() -> None:
    quorum = QuorumService(replicas=2, replica_size=1)
    address = quorum.start()
    secret = JobSecret(quorum.secret)
    old = ReplicaComm(
        connect(address, secret),
        address,
        replica=1,
        replica_rank=0,
        replica_size=1,
        num_replicas=2,
        incarnation=0,
        cross_timeout_s=1.0,
    )
    try:
        assert old.membership.epoch == 0
        assert not old.must_join
        # the link of the old rank's host is down from here on: it makes no call
        quorum.remove(1, "host lost")
        quorum.expect(1, 1)
        store = connect(address, secret)
        store.set(p.key_join(1), p.encode(p.JoinRequest(1, 1)))  # incarnation 1 caught up
        admitted = quorum.poll_joins()
        assert admitted is not None
        assert admitted.joining == (1,)
        assert quorum.remove(0, "another loss") is not None
        assert quorum.current.members == (1,)
        # the link is back: the old rank goes on with the exchange it was in
        with pytest.raises(LeftQuorum, match="out of the quorum in epoch 1"):
            old.exchange(torch.ones(4), step=7, batch=7)
        assert old.membership.epoch == 0  # it never took replica 1's place in a later epoch
        assert not store.check([p.key_ledger(1, 7)])  # nor marked a batch trained for it
    finally:
        old.close()
        quorum.close()
