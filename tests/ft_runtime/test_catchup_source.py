"""The source side of a catch-up against a real TCPStore: what it serves and logs, and
that a joiner which died during its catch-up does not keep the source serving."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.distributed import TCPStore

from ft_runtime.catchup import SnapshotServer, fetch_snapshot, fetch_update
from ft_runtime.rejoin import CatchUpClient, CatchUpSource
from ft_runtime.replica.protocol import ServerAddress, encode, key_address


@pytest.fixture
def source() -> Iterator[tuple[TCPStore, CatchUpSource]]:
    store = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    server = SnapshotServer()
    store.set(key_address(0), encode(ServerAddress.parse(server.address)))
    weights = torch.arange(4.0)
    yield store, CatchUpSource(store, server, replica=0, state_fn=lambda: {"w": weights})
    server.close()


def step(source: CatchUpSource, number: int) -> None:
    source.after_step(number, torch.full((4,), float(number)), 0.1)


def test_a_joiner_gets_the_snapshot_and_every_update_since(source) -> None:
    store, src = source
    joiner = CatchUpClient(store, replica=1, replica_rank=0)
    joiner.request(source=0, source_rank=0, incarnation=1)
    step(src, 5)  # takes the request: the snapshot is the state after step 5
    assert src.serving
    for number in (6, 7):
        step(src, number)
    start, state = fetch_snapshot(joiner.address, f"w{joiner.want}")
    assert start == 6
    assert torch.equal(state["w"], torch.arange(4.0))
    assert [fetch_update(joiner.address, s)["update"][0].item() for s in (6, 7)] == [6.0, 7.0]
    joiner.done()
    step(src, 8)
    assert not src.serving
    assert src.server.log == {}


def test_a_joiner_that_died_during_its_catch_up_is_superseded_by_its_next_incarnation(
    source,
) -> None:
    store, src = source
    dead = CatchUpClient(store, replica=1, replica_rank=0)
    dead.request(source=0, source_rank=0, incarnation=1)
    step(src, 5)
    step(src, 6)  # logged for the first joiner, which dies here and never says done
    again = CatchUpClient(store, replica=1, replica_rank=0)
    again.request(source=0, source_rank=0, incarnation=2)
    step(src, 7)  # the new request: the old one is closed, updates before 8 are not needed
    assert sorted(src.server.log) == []
    step(src, 8)
    assert sorted(src.server.log) == [8]
    assert fetch_snapshot(again.address, f"w{again.want}")[0] == 8
    again.done()
    step(src, 9)
    assert not src.serving  # nobody is catching up: nothing is logged any more
    step(src, 10)
    assert src.server.log == {}
