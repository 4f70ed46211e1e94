"""Request/reply over pyzmq: a JSON header frame plus optional raw byte frames.

A timed-out REQ socket cannot send again, so it is closed and rebuilt (the "lazy pirate"
pattern of the zmq guide); the caller sees :class:`HolderUnavailable`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import zmq

from ft_runtime.errors import CheckpointError

Frames = Sequence[bytes | memoryview]


class HolderUnavailable(CheckpointError):
    """A holder did not answer in time (killed, node lost, or not started yet)."""


class RemoteError(CheckpointError):
    """A holder answered with an error; the message is the holder's."""


def encode(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode()


def decode(frame: bytes) -> dict[str, Any]:
    """The JSON object of a header frame; CheckpointError for anything else."""
    try:
        out = json.loads(frame)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"a holder message must be JSON: {str(exc)[:100]}") from None
    if not isinstance(out, dict):
        raise CheckpointError("a holder message must be a JSON object")
    return out


class Rpc:
    """One REQ connection to a holder. Not thread-safe: one per thread."""

    def __init__(
        self, ctx: zmq.Context[Any], endpoint: str, timeout_s: float, token: str = ""
    ) -> None:
        self.ctx, self.endpoint, self.timeout_ms = ctx, endpoint, int(timeout_s * 1000)
        self._token = token
        self._sock: zmq.Socket[Any] | None = None

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            s = self.ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
            s.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
            s.connect(self.endpoint)
            self._sock = s
        return self._sock

    def call(
        self, header: dict[str, Any], frames: Frames = ()
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Sends one request and returns ``(reply header, reply byte frames)``.

        Raises:
            HolderUnavailable: no reply within the timeout.
            RemoteError: the holder replied with an error.
        """
        sock = self._socket()
        if self._token:
            header = {**header, "token": self._token}
        try:
            sock.send_multipart([encode(header), *frames], copy=False)
            reply = sock.recv_multipart()
        except zmq.Again:
            self.close()
            raise HolderUnavailable(
                f"holder at {self.endpoint} did not answer {header.get('op')!r} within "
                f"{self.timeout_ms} ms"
            ) from None
        head = decode(reply[0]) if reply else {}
        if not head.get("ok", False):
            raise RemoteError(f"holder at {self.endpoint}: {head.get('error', 'unknown error')}")
        return head, list(reply[1:])

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None


def fetch_into(rpc: Rpc, slot: dict[str, Any], out: memoryview, chunk: int) -> dict[str, Any]:
    """Copies a remote holder's slot into ``out`` chunk by chunk; returns the slot's meta.

    Bytes travel over zmq (what crosses hosts on a real cluster); the holder refuses a chunk
    if the slot was evicted or its segment reused meanwhile, so a torn copy cannot pass.
    """
    key = {k: slot[k] for k in ("owner", "step", "shard", "segment")}
    meta: dict[str, Any] = {}
    nbytes = int(slot["nbytes"])
    for off in range(0, max(nbytes, 1), chunk):
        n = min(chunk, nbytes - off)
        head, frames = rpc.call({"op": "fetch", **key, "offset": off, "length": n})
        if len(frames) != 1 or len(frames[0]) != n:
            raise CheckpointError(f"holder at {rpc.endpoint} sent a short chunk of {key}")
        out[off : off + n] = frames[0]
        meta = head["meta"]
    return meta
