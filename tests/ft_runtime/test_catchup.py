"""Peer catch-up over HTTP: chunked, checksummed, authenticated, exact."""

from __future__ import annotations

import hashlib

import pytest
import torch

from ft_runtime.catchup import SnapshotServer, fetch_snapshot, fetch_update
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


def test_the_token_never_reaches_an_impostor_and_its_answers_are_refused() -> None:
    """A process that holds the address a joiner was given, without the job's token: it
    learns nothing it could replay, and the joiner uses nothing it sends."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Impostor(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(str(self.headers))
            body = b'{"tag": "w1", "step": 0, "bytes": 0, "chunk_bytes": 1, "sha256": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-SHA256", hashlib.sha256(body).hexdigest())
            self.send_header("X-EE-Proof", "0" * 64)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    impostor = ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{impostor.server_address[1]}"
        with pytest.raises(CatchUpError, match="cannot prove it knows the job's token"):
            fetch_snapshot(address, "w1", token="the-job-token-0123456789")
        with pytest.raises(CatchUpError, match="cannot prove"):
            fetch_update(address, 3, token="the-job-token-0123456789")
    finally:
        impostor.shutdown()
        impostor.server_close()
    assert len(seen) == 2
    assert not any("the-job-token" in headers for headers in seen)


def test_a_replayed_request_is_refused(server) -> None:
    import urllib.request

    from ft_runtime.catchup import AUTH_SCHEME, proof

    server.publish("e1", 0, {"w": torch.ones(2)})
    assert server.snapshots["e1"].ready.wait(10)
    nonce, path = "ab" * 16, "/snapshot/e1/meta"
    request = urllib.request.Request(f"http://{server.address}{path}")
    request.add_header("X-EE-Nonce", nonce)
    request.add_header("Authorization", f"{AUTH_SCHEME} {proof('secret', 'request', nonce, path)}")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(request, timeout=10)
