"""Telemetry transport between ranks (or node pollers) and the controller, over ZeroMQ.

Ranks PUSH batches; the controller PULLs them. The rank side never blocks: a send that
would block (the high-water mark is reached because the controller is slow or gone) is
dropped and counted. Wire format, version 1, one JSON object per message::

    {"v": 1, "labels": {"rank": "3", ...}, "samples": [[name, value, time, step], ...]}

Labels common to the batch travel once; a sample may carry a fifth element with its own
extra labels.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import zmq

from collector.types import Sample

log = logging.getLogger(__name__)
WIRE_VERSION = 1
Row = Sequence[Any]


def encode(labels: Mapping[str, str], rows: Sequence[Row]) -> bytes:
    return json.dumps(
        {"v": WIRE_VERSION, "labels": dict(labels), "samples": list(rows)}, separators=(",", ":")
    ).encode()


def decode(payload: bytes) -> list[Sample]:
    """Turns one message into Samples; raises ValueError naming what is malformed."""
    try:
        message = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"telemetry message is not JSON: {exc}") from None
    if not isinstance(message, dict) or message.get("v") != WIRE_VERSION:
        raise ValueError(f"telemetry message lacks wire version {WIRE_VERSION}")
    labels = message.get("labels", {})
    rows = message.get("samples")
    if not isinstance(labels, dict) or not isinstance(rows, list):
        raise ValueError("telemetry message needs a 'labels' object and a 'samples' list")
    return [_sample(row, labels) for row in rows]


def _sample(row: Any, labels: Mapping[str, Any]) -> Sample:
    if not isinstance(row, list) or len(row) not in (4, 5):
        raise ValueError(f"telemetry sample must be [name, value, time, step(, labels)]: {row!r}")
    name, value, time, step = row[:4]
    merged = {str(k): str(v) for k, v in labels.items()}
    if len(row) == 5 and isinstance(row[4], dict):
        merged.update({str(k): str(v) for k, v in row[4].items()})
    try:
        return Sample(
            str(name), float(value), float(time), merged, None if step is None else int(step)
        )
    except (TypeError, ValueError):
        raise ValueError(f"telemetry sample has a non-numeric field: {row!r}") from None


class TelemetryPublisher:
    """Rank side: sends batches without ever blocking; counts what it had to drop."""

    def __init__(self, address: str, high_water_mark: int = 1000, linger_ms: int = 1000):
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, high_water_mark)
        self._socket.setsockopt(zmq.LINGER, linger_ms)
        self._socket.connect(address)
        self.dropped = 0

    def send(self, labels: Mapping[str, str], rows: Sequence[Row]) -> bool:
        try:
            self._socket.send(encode(labels, rows), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += len(rows)
            return False
        return True

    def close(self) -> None:
        self._socket.close()


class TelemetryReceiver:
    """Controller side: binds a PULL socket (loopback by default) and drains it."""

    def __init__(self, address: str = "tcp://127.0.0.1", high_water_mark: int = 100_000):
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.RCVHWM, high_water_mark)
        if address.startswith("tcp://") and address.count(":") == 1:
            port = self._socket.bind_to_random_port(address)
            self.address = f"{address}:{port}"
        else:
            self._socket.bind(address)
            self.address = address
        self.malformed = 0

    def receive(self, timeout_s: float = 0.0, max_messages: int = 10_000) -> list[Sample]:
        """Returns every sample that arrived, waiting up to ``timeout_s`` for the first."""
        samples: list[Sample] = []
        if not self._socket.poll(int(timeout_s * 1000)):
            return samples
        for _ in range(max_messages):
            try:
                payload = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                samples.extend(decode(payload))
            except ValueError as exc:
                self.malformed += 1
                log.warning("dropped a malformed telemetry message: %s", exc)
        return samples

    def close(self) -> None:
        self._socket.close(linger=0)
