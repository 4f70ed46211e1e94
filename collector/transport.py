"""Telemetry transport between ranks (or node pollers) and the controller, over ZeroMQ.

Ranks PUSH batches; the controller PULLs them. The rank side never blocks: a send that
would block (the high-water mark is reached because the controller is slow or gone) is
dropped and counted. Wire format, version 1, one JSON object per message::

    {"v": 1, "labels": {"rank": "3", ...}, "samples": [[name, value, time, step], ...]}

Labels common to the batch travel once; a sample may carry a fifth element with its own
extra labels. With a per-job key (``key=``, handed to ranks in ``EAGLEEYE_TELEMETRY_KEY``)
a second frame carries the HMAC-SHA256 of the message, and the receiver drops every
message without a valid one. The receiver bounds the size of a message (the socket's
``MAXMSGSIZE``), checks every field against the schema of :mod:`collector._wire`, keeps
times near its own clock and bounds the distinct values of the labels that name series;
a message that fails is dropped, counted by reason and logged once per sender.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq

from collector._wire import WIRE_VERSION, MalformedTelemetry, decode_message
from collector.types import Sample

log = logging.getLogger(__name__)
Row = Sequence[Any]
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
SERIES_LABELS = ("rank", "replica", "node", "gpu")


# how long a closing rank waits for its queued telemetry to reach a controller that does
# not answer yet (paused); a healthy controller takes it at once
CLOSE_LINGER_MS = 10_000


def encode(labels: Mapping[str, str], rows: Sequence[Row]) -> bytes:
    return json.dumps(
        {"v": WIRE_VERSION, "labels": dict(labels), "samples": list(rows)}, separators=(",", ":")
    ).encode()


def sign(key: bytes, payload: bytes) -> bytes:
    """The authentication frame of ``payload`` under the job's ``key``."""
    return hmac.new(key, payload, hashlib.sha256).digest()


def decode(payload: bytes) -> list[Sample]:
    """Turns one message into Samples; raises MalformedTelemetry (a ValueError) naming what
    is malformed. Times are not compared with a clock here (the receiver does that)."""
    return decode_message(payload)


class TelemetryPublisher:
    """Rank side: sends batches without ever blocking; counts what it had to drop.

    ``key``: the job's telemetry key; each message then carries its HMAC.
    ``linger_ms``: how long :meth:`close` waits for what is still queued to reach the
    controller. A controller paused for a while (a swap storm, a slow disk, SIGSTOP) has
    not yet answered the connection of a rank that started during the pause; the rank's
    last steps and checkpoint reports wait for it this long instead of being lost when
    the process exits. Nothing is waited for when everything was delivered.
    """

    def __init__(
        self,
        address: str,
        high_water_mark: int = 1000,
        linger_ms: int = CLOSE_LINGER_MS,
        key: bytes | None = None,
    ):
        # a context of its own: closing it waits for this socket's queue alone, and the
        # process exiting right after cannot cut the delivery short
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, high_water_mark)
        self._socket.setsockopt(zmq.LINGER, linger_ms)
        self._socket.connect(address)
        self._key = key
        self.dropped = 0

    def send(self, labels: Mapping[str, str], rows: Sequence[Row]) -> bool:
        payload = encode(labels, rows)
        frames = [payload] if self._key is None else [payload, sign(self._key, payload)]
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += len(rows)
            return False
        return True

    def close(self) -> None:
        """Closes the connection once what is queued was delivered (at most ``linger_ms``)."""
        self._socket.close()
        self._context.term()


class TelemetryReceiver:
    """Controller side: binds a PULL socket (loopback by default) and drains it.

    Args:
        key: the job's telemetry key; messages without its valid HMAC are dropped. None
            accepts unsigned messages (tests, benchmarks, a local tool).
        max_message_bytes: larger messages are refused by the socket itself.
        max_skew_s: samples further than this from ``clock`` are dropped.
        max_label_values: distinct values each series label (rank, replica, node, gpu) may
            take; a message bringing one more is dropped.

    ``rejected`` counts dropped messages by reason (``auth``, ``schema``, ``clock``,
    ``cardinality``, ``frames``); ``malformed`` is their total.
    """

    def __init__(
        self,
        address: str = "tcp://127.0.0.1",
        high_water_mark: int = 100_000,
        *,
        key: bytes | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_skew_s: float = 300.0,
        max_label_values: int = 4096,
        clock: Callable[[], float] = time.time,
    ):
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.RCVHWM, high_water_mark)
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if address.startswith("tcp://") and address.count(":") == 1:
            port = self._socket.bind_to_random_port(address)
            self.address = f"{address}:{port}"
        else:
            self._socket.bind(address)
            self.address = address
        self._key = key
        self.max_skew_s = max_skew_s
        self.max_label_values = max_label_values
        self.clock = clock
        self.rejected: Counter[str] = Counter()
        self._seen: dict[str, set[str]] = {name: set() for name in SERIES_LABELS}
        self._logged: set[str] = set()

    @property
    def malformed(self) -> int:
        return sum(self.rejected.values())

    def receive(self, timeout_s: float = 0.0, max_messages: int = 10_000) -> list[Sample]:
        """Returns every sample that arrived, waiting up to ``timeout_s`` for the first."""
        samples: list[Sample] = []
        if not self._socket.poll(int(timeout_s * 1000)):
            return samples
        for _ in range(max_messages):
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                samples.extend(self._accept(frames))
            except MalformedTelemetry as exc:
                self._reject(exc, _peer(frames[0]))
        return samples

    def _accept(self, frames: Sequence[zmq.Frame]) -> list[Sample]:
        if len(frames) not in (1, 2):
            raise MalformedTelemetry(f"telemetry message of {len(frames)} frames", "frames")
        payload = frames[0].bytes
        if self._key is not None:
            mac = frames[1].bytes if len(frames) == 2 else b""
            if not hmac.compare_digest(mac, sign(self._key, payload)):
                raise MalformedTelemetry("telemetry message without a valid job HMAC", "auth")
        samples = decode_message(payload, self.clock(), self.max_skew_s)
        self._bound_series(samples)
        return samples

    def _bound_series(self, samples: list[Sample]) -> None:
        """Refuses a message that would add a value beyond the cap to a series label."""
        fresh: dict[str, set[str]] = {}
        for sample in samples:
            for name in SERIES_LABELS:
                value = sample.labels.get(name)
                if value is not None and value not in self._seen[name]:
                    fresh.setdefault(name, set()).add(value)
        for name, values in fresh.items():
            if len(self._seen[name]) + len(values) > self.max_label_values:
                raise MalformedTelemetry(
                    f"telemetry label {name!r} would take over {self.max_label_values} values",
                    "cardinality",
                )
        for name, values in fresh.items():
            self._seen[name] |= values

    def _reject(self, exc: MalformedTelemetry, peer: str) -> None:
        self.rejected[exc.reason] += 1
        sender = exc.sender or peer or "unknown sender"
        if sender not in self._logged and len(self._logged) < 1024:
            self._logged.add(sender)
            log.warning("dropped telemetry from %s (further drops counted only): %s", sender, exc)

    def close(self) -> None:
        self._socket.close(linger=0)


def _peer(frame: zmq.Frame) -> str:
    try:
        return str(frame.get("Peer-Address"))
    except (zmq.ZMQError, AttributeError, TypeError, ValueError):
        return ""
