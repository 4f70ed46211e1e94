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
from array import array
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


def replica_secret(secret: bytes) -> str:
    """The quorum store's secret of a replica job across hosts, derived from its shared
    secret on the controller and on every agent: it never crosses the network."""
    return hmac.new(secret, b"eagleeye replica quorum", hashlib.sha256).hexdigest()


def catchup_token(secret: bytes) -> str:
    """The ranks' catch-up token of a replica job across hosts (derived as above)."""
    return hmac.new(secret, b"eagleeye replica catch-up", hashlib.sha256).hexdigest()[:32]


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
    """Refuses replays: per sender, a session's ``seq`` (0 to 2**64 - 1) must rise; a new
    session (an agent restarted) starts again, and a session seen before never comes back.

    Each sender has a slot (``slot``) in three flat tables (``tables``): its last
    session as a number (when it is 16 lower-case hex digits, as agents' sessions are),
    whether it is one, and its last seq; the controller checks a batch of summaries
    against them at once (``summarybatch.check_replays``) and sends what that cannot
    judge here, one by one.
    """

    def __init__(self) -> None:
        self._slot: dict[str, int] = {}
        self._session: list[str] = []
        self._key = array("Q")
        self._keyed = array("B")
        self._seq = array("Q")
        self._ended: dict[str, set[str]] = {}

    def check(self, message: Message) -> None:
        self.check_seq(message.sender, message.session, message.seq)

    def check_seq(self, sender: str, session: str, seq: int) -> None:
        """Raises Refused when ``seq`` of ``session`` replays what ``sender`` sent (or is
        out of range)."""
        if not 0 <= seq < 1 << 64:
            raise Refused(f"{sender} sent seq {seq}, not from 0 to 2**64 - 1", "schema")
        slot = self._slot.get(sender)
        if slot is not None and self._session[slot] == session:  # the usual case
            if seq <= self._seq[slot]:
                last = self._seq[slot]
                raise Refused(f"{sender} sent seq {seq} after {last}: a replay", "replay")
            self._seq[slot] = seq
            return
        ended = self._ended.setdefault(sender, set())
        if session in ended:
            raise Refused(f"{sender} sent a message of an ended session: a replay", "replay")
        key = session_key(session)
        if slot is None:
            slot = self._slot[sender] = len(self._session)
            self._session.append(session)
            self._key.append(0)
            self._keyed.append(0)
            self._seq.append(0)
        elif len(ended) < 4096:
            ended.add(self._session[slot])
        self._session[slot] = session
        self._key[slot] = key if key is not None else 0
        self._keyed[slot] = key is not None
        self._seq[slot] = seq

    def slot(self, sender: str) -> int:
        """``sender``'s slot in ``tables`` (-1: nothing came from it yet)."""
        return self._slot.get(sender, -1)

    def tables(self) -> tuple[array[int], array[int], array[int]]:
        """The senders' last session as a number, whether it is one, and last seq, by
        slot (to read, or to raise a seq in place; never to resize)."""
        return self._key, self._keyed, self._seq


def session_key(session: str) -> int | None:
    """A session of 16 lower-case hex digits as a number (a summary's 8 session bytes,
    big-endian); None for any other session."""
    if len(session) != 16 or session.strip("0123456789abcdef"):
        return None
    return int(session, 16)


__all__ = [
    "Message",
    "Refused",
    "Sequencer",
    "catchup_token",
    "read_secret",
    "replica_secret",
    "seal",
    "session_key",
    "unseal",
]
