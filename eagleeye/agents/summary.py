"""Telemetry reduced on the host: one summary per step of the host's ranks.

An agent receives its ranks' step telemetry and, instead of forwarding every rank's
samples, sends the controller one ``HostSummary`` per step: for each metric the host's
count, median, minimum, maximum and robust spread (1.4826 × the median absolute
deviation), plus the raw values of the ranks that stand out against the host's median
(any non-finite value; a value further from the median than ``z`` robust spreads and
``rel`` of the median). The controller's intake thus grows with hosts, not ranks, while
the raw series stay on the host.

The summary crosses the network as a compact binary message (version 2), sealed like
every agent message with the HMAC-SHA256 of the job's shared secret (``SummaryMac``: the
same MAC as ``wire.seal``, its key's padded states computed once; the magic ``EEHS``
keeps a summary apart from a JSON message)::

    header  "EEHS", version u8, session 8 bytes, seq u64, step i64, attempt u32,
            ranks u32, metrics u16, outliers u16, names' length u16
    names   the metric names, UTF-8, joined by "\\n"
    stats   metrics × (count, median, min, max, spread), float64
    rows    per outlier: rank u32, values u16, then values × (metric index u16, float64)

``decode_summary`` validates every field (sizes, names, finite and ordered statistics,
counts within the ranks) and raises ``Refused`` on the first fault; nothing in a refused
message is acted on. The controller opens a drained socket's summaries together
(``summarybatch.open_summaries``: one MAC per message, the headers and statistics of the
messages alike checked in one vectorised pass, to the same rules).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import statistics
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from eagleeye.agents.wire import Refused

if TYPE_CHECKING:
    import numpy as np

MAGIC = b"EEHS"
SUMMARY_VERSION = 2
STATS = ("count", "median", "min", "max", "spread")
MAX_METRICS = 256
MAX_NAME = 128
MAX_RANKS = 1 << 16
MAX_SUMMARY_BYTES = 1 << 20  # as any agent message (wire.MAX_MESSAGE_BYTES)
_HEADER = struct.Struct("<4sB8sQqIIHHH")
_HEADER_SIZE = _HEADER.size
_ROW = struct.Struct("<IH")
_VALUE = struct.Struct("<Hd")
_STATS: dict[int, struct.Struct] = {}
_NAMES: dict[bytes, tuple[str, ...]] = {}
#: A robust spread from the median absolute deviation (that of a normal distribution).
MAD_SCALE = 1.4826


@dataclass(frozen=True, slots=True)
class RankRow:
    """The raw values of one rank that stands out, for one step."""

    rank: int
    values: Mapping[str, float]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))


@dataclass(frozen=True, slots=True)
class HostSummary:
    """One host's step, reduced (version ``SUMMARY_VERSION``).

    ``stats`` holds ``len(names) × 5`` little-endian float64, metric by metric in the
    order of ``STATS`` (``table()`` is them as an array, ``stat(name, "median")`` one of
    them). ``node`` and ``agent`` are set by the receiver from the admitted sender, never
    read from the message; ``at`` is the receiver's clock.
    """

    step: int
    attempt: int
    ranks: int
    names: tuple[str, ...]
    stats: bytes
    outliers: tuple[RankRow, ...] = ()
    node: str = ""
    agent: str = ""
    at: float = 0.0
    version: int = SUMMARY_VERSION

    def table(self) -> np.ndarray:
        """The statistics as a ``len(names) × 5`` array."""
        import numpy as np  # here: the agents' wire stays light to import

        return np.frombuffer(self.stats, "<f8").reshape(len(self.names), 5)

    def stat(self, name: str, which: str) -> float:
        """One statistic (``STATS``) of one metric; KeyError when the host has no such."""
        if name not in self.names:
            raise KeyError(name)
        return float(self.table()[self.names.index(name), STATS.index(which)])


@dataclass(frozen=True, slots=True)
class Reduction:
    """When a rank stands out on a metric: a non-finite value, or one further from the
    host's median than ``z`` robust spreads and ``rel`` × |median| and ``floor``."""

    z: float = 4.0
    rel: float = 0.2
    floor: float = 1e-3


def summarise(
    step: int,
    attempt: int,
    values: Mapping[int, Mapping[str, float]],
    reduction: Reduction = Reduction(),
) -> HostSummary:
    """The summary of one step from each rank's values (``{rank: {metric: value}}``)."""
    names = sorted({name for row in values.values() for name in row})[:MAX_METRICS]
    stats: list[float] = []
    standing: set[int] = set()
    for name in names:
        got = [(rank, row[name]) for rank, row in values.items() if name in row]
        finite = [v for _, v in got if math.isfinite(v)]
        standing |= {rank for rank, v in got if not math.isfinite(v)}
        if not finite:
            stats += [0.0, 0.0, 0.0, 0.0, 0.0]
            continue
        median = statistics.median(finite)
        spread = MAD_SCALE * statistics.median([abs(v - median) for v in finite])
        stats += [float(len(finite)), median, min(finite), max(finite), spread]
        if len(finite) >= 3:
            bar = max(reduction.z * spread, reduction.rel * abs(median), reduction.floor)
            standing |= {r for r, v in got if math.isfinite(v) and abs(v - median) > bar}
    rows = tuple(
        RankRow(rank, {n: v for n, v in values[rank].items() if n in names})
        for rank in sorted(standing)
    )
    packed = _stats_struct(len(names)).pack(*stats)
    return HostSummary(step, attempt, len(values), tuple(names), packed, rows)


class SummaryMac:
    """HMAC-SHA256 (RFC 2104) under one key, as ``hmac.digest(key, payload, "sha256")``:
    the inner and outer padded keys are hashed once, so each message costs two SHA-256
    finishes and no key set-up (half of ``hmac.digest``'s time on a summary)."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def __call__(self, payload: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(payload)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def verify(self, payload: bytes, mac: bytes) -> bool:
        """Whether ``mac`` is the MAC of ``payload`` (compared in constant time)."""
        inner = self._inner.copy()
        inner.update(payload)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return hmac.compare_digest(outer.digest(), mac)


_BLOCK = 64  # SHA-256's block size
_MACS: dict[bytes, SummaryMac] = {}


def summary_mac(secret: bytes) -> SummaryMac:
    """The MAC that seals summaries under the job's shared secret."""
    mac = _MACS.get(secret)
    if mac is None:
        if len(_MACS) >= 64:
            _MACS.clear()
        mac = _MACS[secret] = SummaryMac(secret)
    return mac


def encode_summary(summary: HostSummary, secret: bytes, session: str, seq: int) -> list[bytes]:
    """The sealed frames of ``summary``: the payload and its HMAC-SHA256 under the job's
    shared ``secret``."""
    names = "\n".join(summary.names).encode()
    index = {name: i for i, name in enumerate(summary.names)}
    parts = [
        _HEADER.pack(
            MAGIC,
            SUMMARY_VERSION,
            bytes.fromhex(session),
            seq,
            summary.step,
            summary.attempt,
            summary.ranks,
            len(summary.names),
            len(summary.outliers),
            len(names),
        ),
        names,
        summary.stats,
    ]
    for row in summary.outliers:
        parts.append(_ROW.pack(row.rank, len(row.values)))
        parts += [_VALUE.pack(index[n], v) for n, v in row.values.items()]
    payload = b"".join(parts)
    return [payload, summary_mac(secret)(payload)]


def is_summary(frames: Sequence[bytes]) -> bool:
    """Whether ``frames`` claim to be a summary (a sealed JSON message cannot)."""
    return len(frames) == 2 and frames[0][:4] == MAGIC


@dataclass(frozen=True, slots=True)
class Sealed:
    """A summary's envelope: its sender's session and sequence number (for replays)."""

    session: str
    seq: int


#: A summary's parts as ``parse_summary`` reads them: session (hex), seq, step, attempt,
#: ranks, names, stats (bytes), outlier rows.
Parsed = tuple[str, int, int, int, int, tuple[str, ...], bytes, tuple[RankRow, ...]]


def parse_summary(secret: bytes, payload: bytes, mac: bytes) -> Parsed:
    """The parts of the summary ``payload`` sealed by ``mac``, all checked but the
    statistics' values (``stats_sound``; the controller's intake checks them host by
    host, vectorised); raises Refused (``auth``, ``schema``)."""
    if not summary_mac(secret).verify(payload, mac):
        raise Refused("a summary without a valid MAC of the shared secret", "auth")
    return parse_payload(payload)


def parse_payload(payload: bytes) -> Parsed:
    """``parse_summary`` of a payload whose MAC was checked."""
    if len(payload) > MAX_SUMMARY_BYTES:
        raise Refused(f"a summary of {len(payload)} bytes, over {MAX_SUMMARY_BYTES}", "schema")
    try:
        magic, version, session, seq, step, attempt, ranks, n, n_rows, n_names = (
            _HEADER.unpack_from(payload)
        )
    except struct.error:
        raise Refused("a summary shorter than its header", "schema") from None
    if magic != MAGIC:
        raise Refused(f"a summary starting {magic!r}, not {MAGIC!r}", "schema")
    if version != SUMMARY_VERSION:
        raise Refused(f"a summary of version {version}, not {SUMMARY_VERSION}", "schema")
    if step < 0 or not 0 < ranks <= MAX_RANKS or n > MAX_METRICS or n_rows > ranks:
        raise Refused(
            f"a summary of step {step}, {ranks} ranks, {n} metrics, {n_rows} outliers",
            "schema",
        )
    at = _HEADER_SIZE + n_names
    names = _NAMES.get(payload[_HEADER_SIZE:at]) or _names(payload[_HEADER_SIZE:at], n)
    end = at + 40 * n
    if len(names) != n or end > len(payload):
        raise Refused("a summary cut short, or naming other metrics than it counts", "schema")
    if n_rows:
        rows = _rows(payload, end, n_rows, names)
    elif end != len(payload):
        raise Refused(f"a summary with {len(payload) - end} bytes too many", "schema")
    else:
        rows = ()
    stats = payload[at:end]
    return session.hex(), seq, step, attempt, ranks, names, stats, rows


def decode_summary(secret: bytes, frames: Sequence[bytes]) -> tuple[Sealed, HostSummary]:
    """The envelope and the validated summary in ``frames`` (the payload and its MAC);
    raises Refused (``frames``, ``auth``, ``schema``)."""
    if len(frames) != 2:
        raise Refused(f"a summary of {len(frames)} frames, not 2", "frames")
    session, seq, step, attempt, ranks, names, stats, rows = parse_summary(secret, *frames)
    summary = HostSummary(step, attempt, ranks, names, stats, rows)
    if not stats_sound(stats, ranks):
        raise Refused("a summary whose statistics are not finite, ordered, in range", "schema")
    return Sealed(session, seq), summary


def stats_sound(stats: bytes, ranks: int) -> bool:
    """Whether a summary's statistics are sound: every number finite, min ≤ median ≤ max,
    spread ≥ 0 and 0 ≤ count ≤ ``ranks``. (The controller's intake checks a whole step
    of hosts at once, vectorised, to the same rules.)"""
    if len(stats) % 40:
        return False
    values = _stats_struct(len(stats) // 40).unpack(stats)
    if not all(map(math.isfinite, values)):
        return False
    for at in range(0, len(values), 5):
        count, median, low, high, spread = values[at : at + 5]
        if not (low <= median <= high and spread >= 0 and 0 <= count <= ranks):
            return False
    return True


def _stats_struct(n: int) -> struct.Struct:
    block = _STATS.get(n)
    if block is None:
        block = _STATS[n] = struct.Struct(f"<{5 * n}d")
    return block


def _names(raw: bytes, n: int) -> tuple[str, ...]:
    try:
        names = tuple(raw.decode().split("\n")) if raw else ()
    except UnicodeDecodeError:
        raise Refused("a summary whose metric names are not UTF-8", "schema") from None
    if len(names) != n or len(set(names)) != n:
        raise Refused(f"a summary naming {len(names)} distinct metrics of {n}", "schema")
    if any(not name or len(name) > MAX_NAME for name in names):
        raise Refused(f"a summary with a metric name empty or over {MAX_NAME}", "schema")
    if len(_NAMES) < 1024:
        _NAMES[raw] = names
    return names


def _rows(payload: bytes, at: int, n_rows: int, names: tuple[str, ...]) -> tuple[RankRow, ...]:
    rows = []
    try:
        for _ in range(n_rows):
            rank, count = _ROW.unpack_from(payload, at)
            at += _ROW.size
            values = {}
            for _ in range(count):
                index, value = _VALUE.unpack_from(payload, at)
                at += _VALUE.size
                values[names[index]] = value
            rows.append(RankRow(rank, values))
    except (struct.error, IndexError):
        raise Refused("a summary whose outlier rows break the schema", "schema") from None
    if at != len(payload):
        raise Refused(f"a summary with {len(payload) - at} bytes too many", "schema")
    if len({row.rank for row in rows}) != len(rows):
        raise Refused("a summary naming one rank twice", "schema")
    return tuple(rows)


__all__ = [
    "HostSummary",
    "RankRow",
    "Reduction",
    "Sealed",
    "SummaryMac",
    "stats_sound",
    "decode_summary",
    "encode_summary",
    "is_summary",
    "parse_payload",
    "parse_summary",
    "summary_mac",
    "summarise",
]
