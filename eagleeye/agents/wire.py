"""The agents' wire: JSON messages sealed with the job's shared secret.

A message is two ZeroMQ frames, ``payload`` and ``HMAC-SHA256(secret, payload)``; the
payload is ``{"v": 1, "kind": ..., "sender": ..., "session": ..., "seq": n, "body": {...}}``.
``seq`` rises by one or more with each message of a sender's session, so a message
recorded and sent again is refused as a replay. A message that is not two frames, lacks a
valid HMAC, breaks the schema or replays is refused (``Refused``, with a short reason for
counting) and never acted on. Times in a message are never trusted: whoever receives it
stamps it with its own clock.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from eagleeye.errors import EagleEyeError

WIRE_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20
MIN_SECRET_BYTES = 16


class Refused(ValueError):
    """A message refused: ``reason`` is ``frames``, ``auth``, ``schema`` or ``replay``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Message:
    kind: str
    sender: str
    session: str
    seq: int
    body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", MappingProxyType(dict(self.body)))


def read_secret(path: str | Path) -> bytes:
    """The shared secret in ``path`` (surrounding white space dropped).

    Raises:
        EagleEyeError: the file is missing, unreadable or holds under 16 bytes.
    """
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise EagleEyeError(
            f"cannot read the shared secret {path}: {exc.strerror or exc}; give a readable file"
        ) from None
    if len(secret) < MIN_SECRET_BYTES:
        raise EagleEyeError(
            f"the shared secret in {path} has {len(secret)} bytes; give {MIN_SECRET_BYTES} "
            "or more (e.g. openssl rand -hex 32 > FILE)"
        )
    return secret


def holder_token(secret: bytes) -> str:
    """The snapshot holders' token of a job across hosts, derived from its shared secret:
    every agent's holder and ranks carry the same one, and nobody without the secret."""
    return hmac.new(secret, b"eagleeye snapshot holders", hashlib.sha256).hexdigest()[:32]


def seal(secret: bytes, message: Message) -> list[bytes]:
    payload = json.dumps(
        {
            "v": WIRE_VERSION,
            "kind": message.kind,
            "sender": message.sender,
            "session": message.session,
            "seq": message.seq,
            "body": dict(message.body),
        },
        separators=(",", ":"),
    ).encode()
    return [payload, hmac.new(secret, payload, hashlib.sha256).digest()]


def unseal(secret: bytes, frames: Sequence[bytes]) -> Message:
    """The message in ``frames``; raises Refused when it is not a valid sealed message."""
    if len(frames) != 2:
        raise Refused(f"a message of {len(frames)} frames, not 2", "frames")
    payload, mac = frames
    if not hmac.compare_digest(mac, hmac.new(secret, payload, hashlib.sha256).digest()):
        raise Refused("a message without a valid HMAC of the shared secret", "auth")
    try:
        data = json.loads(payload)
        message = Message(
            kind=_text(data, "kind"),
            sender=_text(data, "sender"),
            session=_text(data, "session"),
            seq=int(data["seq"]),
            body=dict(data.get("body") or {}),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"a sealed message that breaks the schema: {exc}", "schema") from None
    if data.get("v") != WIRE_VERSION:
        raise Refused(f"a message of wire version {data.get('v')!r}", "schema")
    return message


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValueError(f"{key!r} must be a non-empty string of at most 256 characters")
    return value


class Sequencer:
    """Refuses replays: per sender, a session's ``seq`` must rise; a new session (an agent
    restarted) starts again, and a session seen before never comes back."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, int]] = {}
        self._ended: dict[str, set[str]] = {}

    def check(self, message: Message) -> None:
        self.check_seq(message.sender, message.session, message.seq)

    def check_seq(self, sender: str, session: str, seq: int) -> None:
        """Raises Refused when ``seq`` of ``session`` replays what ``sender`` sent."""
        last = self._last.get(sender)
        if last is not None and last[0] == session:  # the usual case: one session
            if seq <= last[1]:
                raise Refused(f"{sender} sent seq {seq} after {last[1]}: a replay", "replay")
            self._last[sender] = (session, seq)
            return
        ended = self._ended.setdefault(sender, set())
        if session in ended:
            raise Refused(f"{sender} sent a message of an ended session: a replay", "replay")
        if last is not None and len(ended) < 4096:
            ended.add(last[0])
        self._last[sender] = (session, seq)


__all__ = ["Message", "Refused", "Sequencer", "read_secret", "seal", "unseal"]
