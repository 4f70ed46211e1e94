"""A holder answers malformed or unauthenticated requests with an error and goes on; a
snapshot altered in memory is refused on load."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import zmq

from ft_runtime.ckpt import CheckpointClient, ClientConfig, Tier
from ft_runtime.ckpt._rpc import Rpc
from ft_runtime.errors import CheckpointsUnusable
from tests.ft_runtime.ckpt.conftest import RingFactory
from tests.ft_runtime.ckpt.test_holder import same, state

pytestmark = pytest.mark.integration
TOKEN = "s3cret-of-this-job"
SHM = Path("/dev/shm")


def flip(segment: Path, at: int) -> None:
    """Alters one byte of a snapshot in place, as a stray write or a forger would."""
    data = bytearray(segment.read_bytes())
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))


def client(ring, token: str = TOKEN, **kw) -> CheckpointClient:
    cfg = ClientConfig("node0", ring, timeout=timedelta(seconds=2), token=token, **kw)
    return CheckpointClient(cfg)


def raw(endpoint: str, frames: list[bytes], kind: int = zmq.REQ) -> list[bytes]:
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        return sock.recv_multipart()
    finally:
        sock.close()


MALFORMED = [
    [b"\xff\xfe not json"],
    [b"[" * 100_000],  # nesting deep enough for a RecursionError
    [b'{"op": ' * 50_000 + b"1" + b"}" * 50_000],
    [b"[]"],
    [b'{"op": 5}'],
    [b'{"op": "__init__"}'],
    [b'{"op": "alloc", "step": "x", "shard": 0, "nshards": 1, "nbytes": 10}'],
    [b'{"op": "alloc", "step": 1, "shard": 0, "nshards": 1, "nbytes": 1e300}'],
    [b'{"op": "fetch", "owner": [], "step": 1, "shard": 0}'],
    [b'{"op": "backup_chunk", "owner": "node0", "step": 1, "shard": 0, "offset": 0}'],
    [b'{"op": "commit", "step": 1, "shard": 0, "meta": {}}', b"extra"],
]


def test_malformed_requests_get_an_error_and_the_holder_keeps_its_snapshots(
    holders: RingFactory,
) -> None:
    ring, _ = holders(1, token=TOKEN)
    endpoint = ring.endpoint("node0")
    c = client(ring)
    assert c.save(state(1), 1).ok
    for frames in MALFORMED:
        head = json.loads(raw(endpoint, frames)[0])
        assert head["ok"] is False, frames[0][:40]
        assert head["error"]
        # the same with the job's token: it passes authentication, still an error
        try:
            req = json.loads(frames[0])
        except (ValueError, RecursionError):
            continue
        if isinstance(req, dict):
            signed = json.dumps({**req, "token": TOKEN}).encode()
            assert json.loads(raw(endpoint, [signed, *frames[1:]])[0])["ok"] is False
    # not even a REQ envelope: a DEALER's bare frame, and an empty one
    dealer = raw(endpoint, [b'{"op": "stop"}'], kind=zmq.DEALER)
    assert json.loads(dealer[-1])["ok"] is False
    got = client(ring).load()
    assert got is not None
    assert got.step == 1
    assert got.tier is Tier.MEMORY
    assert same(got.state, state(1))


def test_requests_without_the_job_token_are_refused(holders: RingFactory) -> None:
    ring, procs = holders(1, token=TOKEN)
    endpoint = ring.endpoint("node0")
    assert client(ring).save(state(1), 1).ok
    stranger = Rpc(zmq.Context.instance(), endpoint, 2.0, token="guess")
    anonymous = Rpc(zmq.Context.instance(), endpoint, 2.0)
    for rpc in (stranger, anonymous):
        for op in (
            {"op": "stop"},
            {"op": "list"},
            {"op": "alloc", "step": 9, "shard": 0, "nshards": 1, "nbytes": 64},
        ):
            with pytest.raises(Exception, match="token"):
                rpc.call(op)
        rpc.close()
    assert not client(ring, token="").save(state(2), 2).ok
    assert procs[0].proc is not None
    assert procs[0].proc.poll() is None
    got = client(ring).load()
    assert got is not None
    assert got.step == 1


def test_a_snapshot_altered_in_memory_is_refused_on_load(
    holders: RingFactory, tmp_path: Path
) -> None:
    ring, _ = holders(1, token=TOKEN)
    c = client(ring)
    assert c.save(state(1), 1).ok
    assert c.save(state(2), 2).ok
    head, _ = Rpc(zmq.Context.instance(), ring.endpoint("node0"), 2.0, TOKEN).call({"op": "list"})
    newest = max(head["slots"], key=lambda s: s["step"])
    flip(SHM / newest["segment"], len(state(2)["model"]["w"]))
    got = client(ring).load()
    assert got is not None
    assert got.step == 1  # step 2 failed its CRC-32: the older snapshot is used
    assert any("CRC-32" in s for s in got.skipped)
    for slot in head["slots"]:  # both altered: checkpoints exist, none is usable
        flip(SHM / slot["segment"], 0)
    with pytest.raises(CheckpointsUnusable):
        client(ring).load()
