"""The telemetry intake checks every field, authenticates, bounds sizes, times and series,
and drops what fails: counted by reason, logged once per sender."""

from __future__ import annotations

import json
import logging
import time

import pytest
import zmq

from collector._wire import MalformedTelemetry, decode_message
from collector.transport import TelemetryPublisher, TelemetryReceiver, decode, encode, sign

NOW = time.time()


def message(labels: object = None, *rows: object) -> bytes:
    body = {"v": 1, "labels": {"rank": "0"} if labels is None else labels, "samples": list(rows)}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "payload",
    [
        message({"replica": "x"}, ["loss", 1.0, NOW, 1]),  # the 110-byte message of the report
        message({"rank": "-1"}, ["loss", 1.0, NOW, 1]),
        message({"rank": "1.5"}, ["loss", 1.0, NOW, 1]),
        message({"attempt": "99999999999999999999"}, ["loss", 1.0, NOW, 1]),
        message({"rank": ["0"]}, ["loss", 1.0, NOW, 1]),
        message({"node": "n" * 5000}, ["loss", 1.0, NOW, 1]),
        message({f"k{i}": "v" for i in range(40)}, ["loss", 1.0, NOW, 1]),
        message(None, ["loss", 1.0, NOW, 1, {"replica": "x"}]),
        message(None, ["loss", 1.0, NOW, 1, ["not", "labels"]]),
        message(None, ["loss", "abc", NOW, 1]),
        message(None, ["loss", True, NOW, 1]),
        message(None, ["loss", 10**30, NOW, 1]),
        message(None, ["loss", 1.0, "now", 1]),
        message(None, ["loss", 1.0, float("nan"), 1]),
        message(None, ["loss", 1.0, float("inf"), 1]),
        message(None, ["loss", 1.0, NOW, 10**30]),
        message(None, ["loss", 1.0, NOW, -5]),
        message(None, ["loss", 1.0, NOW, 1.5]),
        message(None, ["", 1.0, NOW, 1]),
        message(None, [7, 1.0, NOW, 1]),
        b"[" * 100_000,
        b'{"v": 1, "labels": {}, "samples": [["x", 1, 1e400, 1]]}',
        b'{"v": 1, "labels": {}, "samples": [["x", ' + b"9" * 5000 + b", 1, 1]]}",
    ],
)
def test_every_malformed_field_is_a_malformed_telemetry_error(payload: bytes) -> None:
    with pytest.raises(MalformedTelemetry, match="telemetry"):
        decode(payload)


def test_a_nonfinite_value_is_news_and_passes() -> None:
    (sample,) = decode(message(None, ["loss", float("nan"), NOW, 3]))
    assert sample.value != sample.value
    assert sample.step == 3


def test_times_far_from_the_receivers_clock_are_refused() -> None:
    payload = message(None, ["step_time", 0.1, 0.0, 5])
    with pytest.raises(MalformedTelemetry, match="clock") as raised:
        decode_message(payload, now=NOW, max_skew_s=300)
    assert raised.value.reason == "clock"
    assert raised.value.sender == "rank 0"
    assert decode_message(message(None, ["step_time", 0.1, NOW - 10, 5]), NOW, 300)


def receive_for(receiver: TelemetryReceiver, seconds: float = 1.0) -> list:
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got.extend(receiver.receive(timeout_s=0.05))
    return got


def test_only_messages_signed_with_the_job_key_are_accepted() -> None:
    key = b"k" * 32
    receiver = TelemetryReceiver(key=key)
    signed = TelemetryPublisher(receiver.address, key=key)
    forger = TelemetryPublisher(receiver.address)  # no key
    wrong = TelemetryPublisher(receiver.address, key=b"x" * 32)
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.connect(receiver.address)
    try:
        forger.send({"rank": "0"}, [["step_time", 0.1, time.time(), 1]])
        wrong.send({"rank": "0"}, [["step_time", 0.1, time.time(), 2]])
        payload = encode({"rank": "0"}, [["step_time", 0.1, time.time(), 3]])
        raw.send_multipart([payload, sign(key, payload), b"extra"])
        signed.send({"rank": "0"}, [["step_time", 0.1, time.time(), 4]])
        samples = receive_for(receiver)
    finally:
        for socket in (signed, forger, wrong):
            socket.close()
        raw.close(linger=0)
        receiver.close()
    assert [s.step for s in samples] == [4]
    assert receiver.rejected == {"auth": 2, "frames": 1}


def test_an_oversized_message_is_refused_by_the_socket() -> None:
    receiver = TelemetryReceiver(max_message_bytes=10_000)
    big = TelemetryPublisher(receiver.address)
    small = TelemetryPublisher(receiver.address)
    try:
        big.send({"rank": "0"}, [["x" * 4000, 1.0, time.time(), i] for i in range(10)])
        small.send({"rank": "1"}, [["loss", 1.0, time.time(), 1]])
        samples = receive_for(receiver)
    finally:
        big.close()
        small.close()
        receiver.close()
    assert [(s.name, s.labels["rank"]) for s in samples] == [("loss", "1")]


def test_series_labels_take_a_bounded_number_of_values() -> None:
    receiver = TelemetryReceiver(max_label_values=3)
    publisher = TelemetryPublisher(receiver.address)
    try:
        for rank in range(6):
            publisher.send({"rank": str(rank)}, [["loss", 1.0, time.time(), 1]])
        publisher.send({"rank": "1"}, [["loss", 2.0, time.time(), 2]])
        samples = receive_for(receiver)
    finally:
        publisher.close()
        receiver.close()
    assert [s.labels["rank"] for s in samples] == ["0", "1", "2", "1"]
    assert receiver.rejected == {"cardinality": 3}


def test_bad_messages_are_dropped_counted_and_logged_once_per_sender(caplog) -> None:
    receiver = TelemetryReceiver()
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.connect(receiver.address)
    try:
        with caplog.at_level(logging.WARNING, logger="collector.transport"):
            for _ in range(5):
                raw.send(message({"rank": "7"}, ["loss", 1.0, 0.0, 1]))  # stale time
                raw.send(message({"rank": "8"}, ["loss", 1.0, NOW, -1]))
            raw.send(message({"rank": "7"}, ["loss", 1.0, time.time(), 1]))
            samples = receive_for(receiver)
    finally:
        raw.close(linger=0)
        receiver.close()
    assert len(samples) == 1
    assert receiver.rejected == {"clock": 5, "schema": 5}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert any("rank 7" in w for w in warnings)
    assert any("rank 8" in w for w in warnings)
