"""The job's secret and what is derived from it: opaque key names, sealed values, proofs.

torch's ``TCPStore`` has no authentication, and its server listens on every interface
whatever host it is given, so anyone who can reach its port can list, read, write and
delete keys. Replica recovery therefore trusts the store with nothing readable or forgeable:
every key name is replaced by an HMAC of it under the job's secret (a client without the
secret cannot name a key it has not seen), and every value is sealed: encrypted with a key
stream derived from the secret and a fresh nonce, and authenticated with an HMAC over the
key's name, the nonce and the ciphertext (a value cannot be read, forged, altered, or moved
to another key). Only the standard library is used: HMAC-SHA256 as the MAC and, in
counter mode, as the key stream (encrypt-then-MAC).

What a client without the secret can still do: see how many keys there are and how large
their values are, delete them, overwrite them with garbage, or put back a value it copied
earlier under the same key. The first two reveal timing only; the others are caught where
they matter (a value that fails its check is never acted on, heartbeats and epochs only
move forward) or make a rank fail, which the supervisor handles like any other failure.
docs/protocol.md says the same for users.

>>> secret = JobSecret("00" * 16)
>>> secret.open("some/key", secret.seal("some/key", b"3"))
b'3'
>>> secret.name("some/key") == secret.name("some/key") != secret.name("other/key")
True
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from functools import lru_cache

from ft_runtime.replica.protocol import ProtocolError

__all__ = [
    "ENV_REPLICA_SECRET",
    "JobSecret",
    "Unauthenticated",
    "new_secret",
]

ENV_REPLICA_SECRET = "EAGLEEYE_REPLICA_SECRET"
"""The job's secret (hex), handed to its ranks by the supervisor through the environment."""

MAGIC = b"EE1"
NONCE_BYTES = 16
TAG_BYTES = 32
KEY_PREFIX = "ee/"


class Unauthenticated(ProtocolError):
    """A value or a peer failed the check against the job's secret."""


def new_secret() -> str:
    """A fresh job secret: 32 random bytes, as hex."""
    return secrets.token_hex(32)


class JobSecret:
    """Keys derived from one job's secret (any text of at least 16 characters).

    Args:
        secret: the shared secret; ``ENV_REPLICA_SECRET`` carries it to the ranks.
    """

    def __init__(self, secret: str) -> None:
        if len(secret) < 16:
            raise ValueError(
                "the replica secret is shorter than 16 characters; let the supervisor "
                f"make one (unset {ENV_REPLICA_SECRET})"
            )
        root = secret.encode()
        self._names = _derive(root, b"names")
        self._mac = _derive(root, b"mac")
        self._stream = _derive(root, b"stream")
        self._proof = _derive(root, b"proof")
        self.name = lru_cache(maxsize=8192)(self._name)

    @classmethod
    def from_env(cls) -> JobSecret:
        value = os.environ.get(ENV_REPLICA_SECRET, "")
        if not value:
            raise ValueError(
                f"{ENV_REPLICA_SECRET} is not set: ranks of a replica-recovery job get it "
                "from the supervisor; run the script under `eagleeye run --recovery replica`"
            )
        return cls(value)

    def _name(self, key: str) -> str:
        """The opaque name under which ``key`` is stored."""
        digest = hmac.new(self._names, key.encode(), hashlib.sha256).hexdigest()
        return KEY_PREFIX + digest[:40]

    def seal(self, key: str, value: bytes) -> bytes:
        """``value`` encrypted and bound to ``key``."""
        nonce = os.urandom(NONCE_BYTES)
        body = _xor(value, self._keystream(nonce, len(value)))
        return MAGIC + nonce + body + self._tag(key, nonce, body)

    def open(self, key: str, sealed: bytes) -> bytes:
        """The value sealed under ``key``; ``Unauthenticated`` if it was not sealed with
        this secret for this key, or was altered."""
        head = len(MAGIC) + NONCE_BYTES
        if len(sealed) < head + TAG_BYTES or not sealed.startswith(MAGIC):
            raise Unauthenticated(f"the value of {key} is not sealed with the job's secret")
        nonce, body, tag = sealed[len(MAGIC) : head], sealed[head:-TAG_BYTES], sealed[-TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(key, nonce, body)):
            raise Unauthenticated(f"the value of {key} fails its check against the job's secret")
        return _xor(body, self._keystream(nonce, len(body)))

    def prove(self, role: str, *parts: str) -> str:
        """A proof (hex) that the sender knows the secret, bound to ``role`` and ``parts``
        (a nonce of the other side, a path, a digest)."""
        message = "\n".join((role, *parts)).encode()
        return hmac.new(self._proof, message, hashlib.sha256).hexdigest()

    def check(self, proof: str, role: str, *parts: str) -> bool:
        return hmac.compare_digest(proof.encode(), self.prove(role, *parts).encode())

    def _tag(self, key: str, nonce: bytes, body: bytes) -> bytes:
        mac = hmac.new(self._mac, digestmod=hashlib.sha256)
        mac.update(len(key).to_bytes(4, "big") + key.encode())
        mac.update(nonce)
        mac.update(body)
        return mac.digest()

    def _keystream(self, nonce: bytes, size: int) -> bytes:
        blocks = []
        for counter in range((size + 31) // 32):
            block = hmac.new(self._stream, nonce + counter.to_bytes(8, "big"), hashlib.sha256)
            blocks.append(block.digest())
        return b"".join(blocks)[:size]

    def __repr__(self) -> str:
        return "JobSecret(<hidden>)"


def _derive(root: bytes, label: bytes) -> bytes:
    return hmac.new(root, b"eagleeye-replica/" + label, hashlib.sha256).digest()


def _xor(data: bytes, stream: bytes) -> bytes:
    if not data:
        return b""
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data), "big")
