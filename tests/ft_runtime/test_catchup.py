"""Peer catch-up over HTTP: chunked, checksummed, authenticated, exact."""

from __future__ import annotations

import pytest
import torch

from ft_runtime.catchup import SnapshotServer, fetch_snapshot
from ft_runtime.errors import CatchUpError


def state() -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


@pytest.fixture
def server():
    srv = SnapshotServer(token="secret", chunk_bytes=1024)
    yield srv
    srv.close()


def test_a_fetched_snapshot_is_bitwise_the_published_state(server) -> None:
    original = state()
    server.publish("e3", 41, original)
    step, fetched = fetch_snapshot(server.address, "e3", token="secret")
    assert step == 41
    for key, tensor in original["model"].items():  # type: ignore[attr-defined]
        assert torch.equal(fetched["model"][key], tensor)
    assert fetched["optimizer"]["state"][0]["step"] == 1
    assert server.bytes_sent > 1024  # several chunks went over the wire


def test_the_copy_is_taken_at_publish_time(server) -> None:
    weights = {"w": torch.zeros(8)}
    server.publish("e1", 5, weights)
    weights["w"] += 1  # training goes on after publishing
    assert torch.equal(fetch_snapshot(server.address, "e1", token="secret")[1]["w"], torch.zeros(8))


def test_a_wrong_token_or_an_unknown_tag_is_refused(server) -> None:
    server.publish("e1", 0, {"w": torch.ones(2)})
    with pytest.raises(CatchUpError, match="401"):
        fetch_snapshot(server.address, "e1", token="wrong")
    with pytest.raises(CatchUpError, match="404"):
        fetch_snapshot(server.address, "e9", token="secret")


def test_a_corrupt_chunk_is_detected_by_its_checksum(server) -> None:
    server.publish("e1", 0, {"w": torch.randn(1000)})
    snapshot = server.snapshots["e1"]
    assert snapshot.ready.wait(10)
    snapshot.payload = snapshot.payload[:100] + b"\x00" + snapshot.payload[101:]
    with pytest.raises(CatchUpError, match="chunk 0 .* stays corrupt"):
        fetch_snapshot(server.address, "e1", token="secret")


def test_the_rate_limit_schedules_chunks_no_faster_than_asked() -> None:
    srv = SnapshotServer(rate_bytes_s=1e6)
    try:
        srv.throttle(0)
        before = srv._next_send
        srv.throttle(500_000)
        srv.throttle(500_000)
        assert srv._next_send - before == pytest.approx(1.0, abs=0.05)
    finally:
        srv.close()


def test_logged_updates_are_served_by_step_and_verified(server) -> None:
    from ft_runtime.catchup import fetch_update

    update = torch.arange(4.0)
    server.log_update(7, update, 0.5)
    update += 1  # the training loop reuses its buffers: the log kept a copy
    entry = fetch_update(server.address, 7, token="secret")
    assert entry is not None
    assert torch.equal(entry["update"], torch.arange(4.0))
    assert entry["lr"] == 0.5
    assert fetch_update(server.address, 8, token="secret") is None  # not trained yet
