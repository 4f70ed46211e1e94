"""A network client that knows the quorum store's port but not the job's secret.

Real pieces: the quorum service hosting a real TCPStore, two replicas whose ranks run the
real rank side (``ReplicaComm``) on threads, and an outsider with a plain ``TCPStore``
client. The outsider writes everything a rank or the controller would act on (a new epoch,
a broken epoch, commands, catch-up requests, ledger marks, heartbeats); the ranks must
train on as if nothing happened, and nothing the outsider reads shows the membership.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from ft_runtime import _dist as dist
from ft_runtime.ftar import ReplicaComm
from ft_runtime.membership import Membership
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import protocol as p
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.store import connect

pytestmark = pytest.mark.timeout(120)
STEPS = 6
ATTACK_AFTER = 2


def outsider_attack(address: str) -> list[str]:
    """Everything a client without the secret tries; returns what it could read."""
    host, _, port = address.rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5))
    readable = []
    for key in store.list_keys():
        raw = bytes(store.get(key))
        readable.append(key + " " + raw.decode("latin-1"))
    forged = Membership(9, (1,))
    store.set(p.KEY_EPOCH, p.encode(p.EpochPointer(9)))
    store.set(p.key_members(9), p.encode_membership(forged))
    store.set(p.key_broken(0), p.encode(p.EpochBroken("outsider")))
    store.set(p.key_command(1), p.encode(p.Command(1, "rollback", step=0, lr_factor=0.01)))
    store.add(p.KEY_COMMANDS, 1)
    store.set(p.key_catchup(1), p.encode(p.CatchUpRequest(1, 5, 0)))
    store.add(p.KEY_CATCHUP_COUNT, 1)
    store.set(p.key_join(1), p.encode(p.JoinRequest(1, 5)))
    for batch in range(STEPS + 4):
        store.set(p.key_ledger(0, batch), p.encode(p.LedgerMark("skipped")))
    for rank in range(2):
        store.set(p.key_heartbeat(rank), p.encode(p.Heartbeat(10**6, 10**6)))
    return readable


def test_an_outsider_can_neither_read_the_membership_nor_make_a_rank_act() -> None:
    quorum = QuorumService(replicas=2, replica_size=1)
    address = quorum.start()
    secret = JobSecret(quorum.secret)
    barrier = threading.Barrier(3)  # the two ranks and the outsider, after ATTACK_AFTER
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def rank(replica: int) -> None:
        comm = None
        try:
            comm = ReplicaComm(
                connect(address, secret),
                address,
                replica=replica,
                replica_rank=0,
                replica_size=1,
                num_replicas=2,
                token="catch-up-token-0123456789abcdef",
            )
            params = torch.zeros(4)
            commands, epochs, batches = [], [], []
            batch = comm.next_batch()
            for step in range(STEPS):
                if step == ATTACK_AFTER:
                    barrier.wait(30)  # the outsider acts now
                    barrier.wait(30)  # and is done
                grad = torch.full((4,), float(replica + 1) * (step + 1))
                result = comm.exchange(grad, step, batch)
                params -= 0.1 * grad
                comm.after_step(step, grad, 0.1)
                commands += comm.commands()
                epochs.append(result.epoch)
                batches.append(batch)
                batch = comm.next_batch(batch + 1)
            results[replica] = {
                "params": params,
                "commands": commands,
                "epochs": epochs,
                "batches": batches,
                "serving": comm.source.serving or bool(comm.server.snapshots),
                "membership": comm.membership,
            }
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()
        finally:
            if comm is not None:
                comm.close()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    barrier.wait(60)
    readable = outsider_attack(address)
    # what the coordinator would act on, read after the outsider wrote
    assert quorum.poll_joins() is None
    assert quorum.stalled().replicas == ()
    barrier.wait(30)
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert quorum.poll_joins() is None
    assert quorum.current == Membership(0, (0, 1))
    quorum.close()

    # nothing readable: opaque names, sealed values
    assert readable
    assert all(line.startswith("ee/") for line in readable)
    assert not any("members" in line or "joining" in line for line in readable)
    # no rank acted: no command, no epoch change, no catch-up served, no batch skipped
    for replica in (0, 1):
        got = results[replica]
        assert got["commands"] == []
        assert got["epochs"] == [0] * STEPS
        assert got["membership"] == Membership(0, (0, 1))
        assert not got["serving"]
        assert got["batches"] == list(range(STEPS))
    assert torch.equal(results[0]["params"], results[1]["params"])
    expected = -0.1 * sum(1.5 * (step + 1) for step in range(STEPS))
    assert torch.allclose(results[0]["params"], torch.full((4,), expected))
