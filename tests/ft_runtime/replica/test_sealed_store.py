"""The sealed store over a real TCPStore: what a client without the secret sees and can do."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from ft_runtime import _dist as dist
from ft_runtime.membership import Membership
from ft_runtime.replica.auth import JobSecret, Unauthenticated, new_secret
from ft_runtime.replica.protocol import (
    KEY_EPOCH,
    EpochPointer,
    decode,
    encode,
    encode_membership,
    key_members,
)
from ft_runtime.replica.store import SealedStore


@pytest.fixture
def master():
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


def client(master) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=5))


def test_values_round_trip_and_nothing_readable_reaches_the_wire(master) -> None:
    secret = JobSecret(new_secret())
    sealed = SealedStore(client(master), secret)
    sealed.set(key_members(0), encode_membership(Membership(0, (0, 1))))
    sealed.set(KEY_EPOCH, encode(EpochPointer(0)))
    assert decode(EpochPointer, sealed.get(KEY_EPOCH)) == EpochPointer(0)
    outsider = client(master)
    keys = outsider.list_keys()
    assert len(keys) == 2
    assert all(k.startswith("ee/") for k in keys)
    assert not any("q/" in k for k in keys)
    for key in keys:
        raw = bytes(outsider.get(key))
        assert b"members" not in raw
        assert b"epoch" not in raw


def test_a_value_forged_altered_or_moved_is_refused(master) -> None:
    secret = JobSecret(new_secret())
    sealed = SealedStore(client(master), secret)
    outsider = client(master)
    sealed.set("q/0/start", encode(EpochPointer(3)))
    sealed.set("q/1/start", encode(EpochPointer(4)))
    name0, name1 = secret.name("q/0/start"), secret.name("q/1/start")
    outsider.set(name1, outsider.get(name0))  # moved from another key
    with pytest.raises(Unauthenticated):
        sealed.get("q/1/start")
    flipped = bytearray(outsider.get(name0))
    flipped[-40] ^= 1
    outsider.set(name0, bytes(flipped))  # altered
    with pytest.raises(Unauthenticated):
        sealed.get("q/0/start")
    other = SealedStore(outsider, JobSecret(new_secret()))  # another job's secret
    other.set("q/0/start", encode(EpochPointer(9)))
    with pytest.raises(Unauthenticated):
        sealed.get("q/0/start")
    outsider.set(name0, "{}")
    assert sealed.multi_get(["q/0/start", "q/1/start"]) == [b"", b""]


def test_counters_add_up_across_clients(master) -> None:
    secret = JobSecret(new_secret())
    stores = [SealedStore(client(master), secret) for _ in range(4)]

    def bump(store: SealedStore) -> None:
        for _ in range(25):
            store.add("ctl/count", 1)

    threads = [threading.Thread(target=bump, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stores[0].add("ctl/count", 0) == 100
    assert stores[0].add("q/wants", 0) == 0  # an absent counter is 0


def test_gloo_meets_through_a_sealed_store(master) -> None:
    secret = JobSecret(new_secret())
    out: dict[int, torch.Tensor] = {}
    keep: list[SealedStore] = []

    def rank(r: int) -> None:
        store = SealedStore(client(master), secret)
        keep.append(store)
        group = dist.gloo_group(dist.PrefixStore("x/0/0", store), r, 2, 10.0)
        tensor = torch.full((3,), float(r + 1))
        group.allreduce([tensor]).wait()
        out[r] = tensor

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(out[0], torch.full((3,), 3.0))
    assert torch.equal(out[1], out[0])
    assert all(k.startswith("ee/") for k in client(master).list_keys())
