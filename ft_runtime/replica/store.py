"""The quorum's store as the protocol sees it: every key opaque, every value sealed.

``SealedStore`` is a ``torch.distributed.Store`` written in Python over a ``TCPStore``
client: each key is stored under its opaque name and each value sealed with the job's
secret (``ft_runtime.replica.auth``). Because it is a real ``Store``, gloo's own rendezvous
(through a ``PrefixStore`` over it) is sealed too: a client without the secret can neither
read nor plant the addresses gloo connects to. Counters (``add``) are sealed as well and
kept with ``compare_set``.

A ``PrefixStore`` or group built over a ``SealedStore`` calls back into this Python object:
keep the object referenced for as long as they live (``connect`` returns it; ReplicaComm
keeps the ones it builds groups on).
"""

from __future__ import annotations

from datetime import timedelta

from ft_runtime import _dist as dist
from ft_runtime.replica.auth import JobSecret, Unauthenticated

__all__ = ["SealedStore", "Unauthenticated", "connect"]


class SealedStore(dist.Store):
    """A store whose keys and values are protected by the job's secret.

    Args:
        inner: the ``TCPStore`` client (or master) that holds the bytes.
        secret: the job's secret.
    """

    def __init__(self, inner: dist.Store, secret: JobSecret) -> None:
        super().__init__()
        self.inner = inner
        self.secret = secret

    # ---- the Store interface ----------------------------------------------------------------
    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self.inner.set(self.secret.name(key), self.secret.seal(key, data))  # type: ignore[arg-type]

    def get(self, key: str) -> bytes:
        return self.secret.open(key, bytes(self.inner.get(self.secret.name(key))))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Values of ``keys``; one that fails its check reads as empty (which no message
        decodes from), so one bad value does not hide the others."""
        raws = self.inner.multi_get([self.secret.name(k) for k in keys])
        values = []
        for key, raw in zip(keys, raws, strict=True):
            try:
                values.append(self.secret.open(key, bytes(raw)))
            except Unauthenticated:
                values.append(b"")
        return values

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def check(self, keys: list[str]) -> bool:
        return bool(self.inner.check([self.secret.name(k) for k in keys]))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        names = [self.secret.name(k) for k in keys]
        if timeout is None:
            self.inner.wait(names)
        else:
            self.inner.wait(names, timeout)

    def delete_key(self, key: str) -> bool:
        return bool(self.inner.delete_key(self.secret.name(key)))

    def add(self, key: str, amount: int) -> int:
        """Adds to a sealed counter (``compare_set`` until no other writer raced it)."""
        name = self.secret.name(key)
        while True:
            current = bytes(self.inner.get(name)) if self.inner.check([name]) else b""
            value = int(self.secret.open(key, current).decode()) if current else 0
            if amount == 0:
                return value
            desired = self.secret.seal(key, str(value + amount).encode())
            got = self.inner.compare_set(name, current, desired)  # type: ignore[arg-type]
            if bytes(got) == desired:
                return value + amount

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        name = self.secret.name(key)
        want = expected.encode() if isinstance(expected, str) else bytes(expected)
        current = bytes(self.inner.get(name)) if self.inner.check([name]) else b""
        value = self.secret.open(key, current) if current else b""
        if value != want:
            return value
        new = desired.encode() if isinstance(desired, str) else bytes(desired)
        sealed = self.secret.seal(key, new)
        got = bytes(self.inner.compare_set(name, current, sealed))  # type: ignore[arg-type]
        return new if got == sealed else self.secret.open(key, got)

    def num_keys(self) -> int:
        return int(self.inner.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    def has_extended_api(self) -> bool:
        return False

    def clone(self) -> SealedStore:
        return SealedStore(self.inner.clone(), self.secret)  # type: ignore[attr-defined]


def connect(address: str, secret: JobSecret, timeout_s: float = 60.0) -> SealedStore:
    """A sealed client of the quorum's store at ``host:port``."""
    host, _, port = address.rpartition(":")
    inner = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    return SealedStore(inner, secret)
