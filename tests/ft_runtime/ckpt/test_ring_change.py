"""A node's holder replaced on another host (a spare took its place), with real holder
processes on loopback: the new holder pulls the node's snapshots back from the next
node's backups, the surviving holder is told the new ring (a token-authenticated
``ring`` request) and backs up to the new holder from then on, keeping what it holds.
A forged or invalid ring request is refused and changes nothing, and a backup from a
holder that is not the node's previous one in its ring is refused."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import zmq

from ft_runtime.ckpt import (
    CheckpointClient,
    ClientConfig,
    HolderConfig,
    HolderProcess,
    Ring,
    Tier,
)
from ft_runtime.ckpt._rpc import RemoteError, Rpc
from ft_runtime.ckpt.config import ring_text
from tests.ft_runtime.ckpt.conftest import RingFactory, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
TOKEN = "ring-token"


def state(step: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(5_000, generator=g), "step": step}


def client(ring: Ring, node: str) -> CheckpointClient:
    cfg = ClientConfig(node, ring, timeout=timedelta(seconds=2), token=TOKEN)
    return CheckpointClient(cfg)


def held(endpoint: str, owner: str, token: str = TOKEN) -> list[int]:
    rpc = Rpc(zmq.Context.instance(), endpoint, 5.0, token)
    try:
        head, _ = rpc.call({"op": "list", "owner": owner})
    finally:
        rpc.close()
    return sorted(s["step"] for s in head["slots"])


def ask(endpoint: str, request: dict[str, object], token: str = TOKEN) -> dict[str, object]:
    rpc = Rpc(zmq.Context.instance(), endpoint, 5.0, token)
    try:
        head, _ = rpc.call(request)
    finally:
        rpc.close()
    return head


def test_a_spares_holder_takes_a_lost_nodes_place_and_the_survivor_backs_up_to_it(
    holders: RingFactory, job: str, tmp_path: Path
) -> None:
    ring, procs = holders(2, token=TOKEN)
    ep0, ep1 = ring.endpoint("node0"), ring.endpoint("node1")
    for node in ("node0", "node1"):
        c = client(ring, node)
        for step in (10, 20):
            assert c.save(state(step), step).ok
        c.close()
    wait_for(lambda: held(ep1, "node0") == [10, 20], what="node0 backed up on node1")
    wait_for(lambda: held(ep0, "node1") == [10, 20], what="node1 backed up on node0")
    procs[1].kill()  # node1's host is lost, with its memory

    new = Ring((("node0", ep0), ("node1", f"tcp://127.0.0.1:{free_port()}")))
    spare = HolderProcess(HolderConfig(job, "node1", new, token=TOKEN)).start()
    try:
        # the spare's holder pulls node1's snapshots back from node0's backups
        wait_for(lambda: held(new.endpoint("node1"), "node1") == [10, 20], what="node1 pulled")
        reply = ask(ep0, {"op": "ring", "ring": ring_text(new)})
        assert reply["ring"] == ring_text(new)
        # the survivor keeps its memory and backs its snapshots up to the spare's holder
        wait_for(lambda: held(new.endpoint("node1"), "node0") == [10, 20], what="re-backup")
        assert held(ep0, "node0") == [10, 20]
        c0 = client(new, "node0")
        assert c0.save(state(30), 30).ok
        wait_for(lambda: 30 in held(new.endpoint("node1"), "node0"), what="new backups")
        got0 = c0.load()
        assert got0 is not None
        assert (got0.step, got0.tiers) == (30, (Tier.MEMORY,))
        c0.close()
        c1 = client(new, "node1")
        got1 = c1.load(at_most=20)
        assert got1 is not None
        assert got1.step == 20
        assert torch.equal(got1.state["w"], state(20)["w"])  # type: ignore[index]
        c1.close()
    finally:
        spare.stop()


def test_a_forged_or_invalid_ring_request_is_refused_and_changes_nothing(
    holders: RingFactory,
) -> None:
    ring, _ = holders(2, token=TOKEN)
    ep0, ep1 = ring.endpoint("node0"), ring.endpoint("node1")
    other = f"tcp://127.0.0.1:{free_port()}"
    forged = {"op": "ring", "ring": f"node0={ep0},node1={other}"}
    for token in ("", "guess"):  # no token, a wrong one
        with pytest.raises(RemoteError, match="token"):
            ask(ep0, forged, token=token)
    invalid = {
        f"node0={ep0},node2={other}": "only endpoints may change",  # another node
        f"node1={other},node0={ep0}": "only endpoints may change",  # another order
        f"node0={ep0}": "only endpoints may change",  # a node dropped
        f"node0={other},node1={ep1}": "listens at",  # this node moved
        "node0": "expected node=endpoint pairs",
        f"node0={ep0},node0={ep1}": "unique",
    }
    for text, why in invalid.items():
        with pytest.raises(RemoteError, match=why):
            ask(ep0, {"op": "ring", "ring": text})
    with pytest.raises(RemoteError, match="'ring' must be"):
        ask(ep0, {"op": "ring", "ring": ["node0", ep0]})
    raw = zmq.Context.instance().socket(zmq.REQ)  # a ring smuggled in a malformed message
    raw.setsockopt(zmq.RCVTIMEO, 5000)
    raw.connect(ep0)
    raw.send(b"{" + json.dumps(forged).encode())
    assert json.loads(raw.recv())["ok"] is False
    raw.close(linger=0)
    # a backup from a holder that is not this node's previous one (a replaced host's)
    stale = {"op": "backup_begin", "owner": "node1", "step": 5, "shard": 0, "nshards": 1}
    with pytest.raises(RemoteError, match="backup refused: it comes from"):
        ask(ep0, {**stale, "nbytes": 8, "meta": {}, "from": other})
    with pytest.raises(RemoteError, match="backup refused"):
        ask(ep0, {**stale, "nbytes": 8, "meta": {}})  # no sender at all
    assert held(ep0, "node1") == []
    # nothing changed: node0's backups still go to node1
    c = client(ring, "node0")
    assert c.save(state(1), 1).ok
    c.close()
    wait_for(lambda: held(ep1, "node0") == [1], what="node0 backed up on node1")
