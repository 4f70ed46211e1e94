from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import zmq

from collector.transport import (
    CLOSE_LINGER_MS,
    TelemetryPublisher,
    TelemetryReceiver,
    decode,
    encode,
)
from ft_runtime.ports import free_port

NOW = time.time()


def receive_all(receiver: TelemetryReceiver, expected: int, timeout_s: float = 5.0) -> list:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        got.extend(receiver.receive(timeout_s=0.1))
    return got


def test_batches_cross_a_real_socket_with_labels() -> None:
    receiver = TelemetryReceiver()
    publisher = TelemetryPublisher(receiver.address)
    try:
        assert publisher.send(
            {"rank": "2", "node": "node1"},
            [["loss", 1.25, NOW, 3], ["collective", 0.5, NOW + 1, 3, {"op": "x"}]],
        )
        samples = receive_all(receiver, 2)
    finally:
        publisher.close()
        receiver.close()
    assert [s.name for s in samples] == ["loss", "collective"]
    assert samples[0].labels == {"rank": "2", "node": "node1"}
    assert samples[1].labels["op"] == "x"
    assert samples[1].step == 3


def test_malformed_messages_are_counted_and_skipped() -> None:
    receiver = TelemetryReceiver()
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(receiver.address)
    try:
        push.send(b"\xff not json")
        push.send(b'{"v": 1, "labels": {}, "samples": [["loss", "abc", 1.0, 1]]}')
        push.send(encode({"rank": "0"}, [["loss", 2.0, time.time(), 1]]))
        samples = receive_all(receiver, 1)
        time.sleep(0.1)
        samples += receiver.receive(timeout_s=0.1)
    finally:
        push.close(linger=0)
        receiver.close()
    assert [s.value for s in samples] == [2.0]
    assert receiver.malformed == 2


@pytest.mark.parametrize(
    "payload",
    [
        b"[]",
        b'{"v": 2}',
        b'{"v": 1, "labels": [], "samples": []}',
        b'{"v": 1, "labels": {}, "samples": [["x", 1]]}',
    ],
)
def test_decode_names_what_is_wrong(payload: bytes) -> None:
    with pytest.raises(ValueError, match="telemetry"):
        decode(payload)


def test_publisher_without_a_controller_never_blocks() -> None:
    publisher = TelemetryPublisher("tcp://127.0.0.1:1", high_water_mark=1, linger_ms=0)
    started = time.perf_counter()
    results = [publisher.send({}, [["x", 1.0, 0.0, i]]) for i in range(100)]
    publisher.close()
    assert time.perf_counter() - started < 1.0
    assert results.count(False) >= 98
    assert publisher.dropped == results.count(False)


_SEND_AND_EXIT = """
import sys, time
from collector.transport import TelemetryPublisher
publisher = TelemetryPublisher(sys.argv[1])
for step in range(5):
    publisher.send({"rank": "0"}, [["loss", 1.0, time.time(), step]])
publisher.close()
"""


def test_a_rank_that_ends_before_a_paused_controller_answers_is_still_heard(tmp_path) -> None:
    """A controller that does not answer yet (paused, or not bound) when a rank sends its
    last steps and exits: the rank's exit waits for the delivery instead of losing them."""
    port = free_port()  # outside the ephemeral range: the rank's reconnects cannot take it
    rank = subprocess.Popen(
        [sys.executable, "-c", _SEND_AND_EXIT, f"tcp://127.0.0.1:{port}"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        time.sleep(2.0)  # the rank has sent and is closing; nobody answers for 2 s
        assert rank.poll() is None, "the rank exited with its telemetry undelivered"
        receiver = TelemetryReceiver(f"tcp://127.0.0.1:{port}")
        try:
            samples = receive_all(receiver, 5, timeout_s=CLOSE_LINGER_MS / 1000)
        finally:
            receiver.close()
        assert rank.wait(timeout=10) == 0
    finally:
        rank.kill()
    assert [s.step for s in samples] == [0, 1, 2, 3, 4]
