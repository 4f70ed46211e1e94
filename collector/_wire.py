"""The telemetry wire schema: every field of a message checked before anything uses it.

A message is one JSON object ``{"v": 1, "labels": {...}, "samples": [[name, value, time,
step(, labels)], ...]}``. What is accepted:

- names and label keys: non-empty strings of at most ``MAX_TEXT`` characters; label values
  strings (or numbers, turned into strings) of at most ``MAX_TEXT`` characters, at most
  ``MAX_LABELS`` labels per sample;
- the identity labels ``rank``, ``replica``, ``attempt`` and the counters ``seq``, ``bytes``:
  decimal integers from 0 below 2**63;
- value: a number (NaN and infinities allowed: a diverged loss is news), integers below 2**63;
- time: a finite number within ``max_skew_s`` of the receiver's clock (when one is given);
- step: null or an integer from 0 below 2**63.

Anything else raises :class:`MalformedTelemetry`, whose message says what was wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from collector.errors import CollectorError
from collector.types import Sample

WIRE_VERSION = 1
INT64 = 2**63
MAX_TEXT = 4096
MAX_LABELS = 32
MAX_SAMPLES = 100_000
INT_LABELS = frozenset({"rank", "replica", "attempt", "seq", "bytes"})


class MalformedTelemetry(CollectorError, ValueError):
    """A telemetry message that breaks the wire schema; ``sender`` names its rank when the
    message got far enough to say, ``reason`` is a short category for counting."""

    def __init__(self, message: str, reason: str = "schema", sender: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.sender = sender


def decode_message(
    payload: bytes, now: float | None = None, max_skew_s: float = math.inf
) -> list[Sample]:
    """Turns one message into Samples; raises MalformedTelemetry naming what is malformed."""
    try:
        message = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedTelemetry(f"telemetry message is not JSON: {exc}") from None
    if not isinstance(message, dict) or message.get("v") != WIRE_VERSION:
        raise MalformedTelemetry(f"telemetry message lacks wire version {WIRE_VERSION}")
    labels = message.get("labels", {})
    rows = message.get("samples")
    if not isinstance(labels, dict) or not isinstance(rows, list):
        raise MalformedTelemetry("telemetry message needs a 'labels' object and a 'samples' list")
    sender = _sender(labels)
    try:
        common = _labels(labels)
        if len(rows) > MAX_SAMPLES:
            raise MalformedTelemetry(f"telemetry message has over {MAX_SAMPLES} samples")
        return [_sample(row, common, now, max_skew_s) for row in rows]
    except MalformedTelemetry as exc:
        exc.sender = sender
        raise


def _sender(labels: Mapping[Any, Any]) -> str:
    rank = labels.get("rank")
    return f"rank {str(rank)[:20]}" if isinstance(rank, str | int) else ""


def _sample(row: Any, common: dict[str, str], now: float | None, max_skew_s: float) -> Sample:
    if not isinstance(row, list) or len(row) not in (4, 5):
        raise MalformedTelemetry(
            f"telemetry sample must be [name, value, time, step(, labels)]: {_show(row)}"
        )
    name, value, time, step = row[:4]
    labels = common
    if len(row) == 5:
        if not isinstance(row[4], dict):
            raise MalformedTelemetry(f"telemetry sample labels must be an object: {_show(row)}")
        labels = {**common, **_labels(row[4])}
        if len(labels) > MAX_LABELS:
            raise MalformedTelemetry(f"telemetry sample has over {MAX_LABELS} labels")
    return Sample(
        _text(name, "sample name"),
        _number(value, row),
        _time(time, row, now, max_skew_s),
        labels,
        _step(step, row),
    )


def _labels(raw: Mapping[Any, Any]) -> dict[str, str]:
    if len(raw) > MAX_LABELS:
        raise MalformedTelemetry(f"telemetry message has over {MAX_LABELS} labels")
    labels = {}
    for key, value in raw.items():
        key = _text(key, "label name")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise MalformedTelemetry(f"telemetry label {key!r} is not a string: {_show(value)}")
        text = _text(str(value), f"label {key!r}")
        if key in INT_LABELS and not _is_count(text):
            raise MalformedTelemetry(
                f"telemetry label {key!r} must be an integer from 0 below 2**63: {_show(text)}"
            )
        labels[key] = text
    return labels


def _is_count(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 19 and int(text) < INT64


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise MalformedTelemetry(
            f"telemetry {what} must be a string of 1 to {MAX_TEXT} characters: {_show(value)}"
        )
    return value


def _number(value: Any, row: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedTelemetry(f"telemetry sample value is not a number: {_show(row)}")
    if isinstance(value, int) and not -INT64 <= value < INT64:
        raise MalformedTelemetry(f"telemetry sample value is beyond 64 bits: {_show(row)}")
    return float(value)


def _time(value: Any, row: Any, now: float | None, max_skew_s: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedTelemetry(f"telemetry sample time is not a number: {_show(row)}")
    if isinstance(value, int) and not 0 <= value < INT64:
        raise MalformedTelemetry(f"telemetry sample time is out of range: {_show(row)}")
    if not math.isfinite(value):
        raise MalformedTelemetry(f"telemetry sample time is not finite: {_show(row)}")
    if now is not None and abs(value - now) > max_skew_s:
        raise MalformedTelemetry(
            f"telemetry sample time is {value - now:+.0f} s from the receiver's clock "
            f"(limit {max_skew_s:g} s): {_show(row)}",
            reason="clock",
        )
    return float(value)


def _step(value: Any, row: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < INT64:
        raise MalformedTelemetry(
            f"telemetry sample step must be null or an integer from 0 below 2**63: {_show(row)}"
        )
    return value


def _show(value: Any) -> str:
    """A short rendering of what was received (a forged message may be large)."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
