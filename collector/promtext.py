"""dcgm-exporter and node-exporter text (the Prometheus exposition format) into Samples.

Parsing is prometheus_client's own parser; what this module adds is tolerance and meaning:

- any label set, with the names that drift between dcgm-exporter versions normalised
  (``Hostname`` and ``hostname`` both become ``node``; ``UUID`` becomes ``uuid``);
- comment lines, missing HELP/TYPE, NaN, and DCGM's "blank" sentinels for unsupported
  fields (values near 9.2e18), which are dropped and counted rather than passed on;
- a malformed line costs that line only (counted), not the whole scrape;
- ``DCGM_FI_DEV_XID_ERRORS`` (a sticky "last XID" gauge) and ``DCGM_EXP_XID_ERRORS_COUNT``
  become XID :class:`~collector.events.Event` records when they change, never a level.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from collector.events import Event, Parsed, clean_label
from collector.types import Sample
from collector.xid import lookup, xid_labels

XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"

#: Label names that mean the same thing across exporter versions, mapped to ours.
LABEL_ALIASES: Mapping[str, str] = {
    "Hostname": "node",
    "hostname": "node",
    "UUID": "uuid",
    "modelName": "model_name",
    "pci_bus_id": "pci",
    "DCGM_FI_DRIVER_VERSION": "driver_version",
}

#: DCGM reports unsupported int64 fields as values from 0x7ffffffffffffff0 up; anything this
#: large is a sentinel, never a measurement.
SENTINEL_FLOOR = 9.0e18

#: A series with more labels than this is dropped: it is a mislabelled exporter or an attack,
#: and would multiply series downstream.
DEFAULT_MAX_LABELS = 64

# Labels that name one GPU; an XID's previous value is kept per such identity.
_GPU_IDENTITY = ("node", "gpu", "uuid", "pci")


def normalise_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Exporter labels with drifting names mapped to ours and values bounded in length."""
    return {LABEL_ALIASES.get(k, k): clean_label(v) for k, v in labels.items()}


class XidTracker:
    """Turns the sticky XID gauge and the windowed XID count into events on change.

    The gauge keeps the last XID until the exporter restarts and cannot show the same XID
    twice in a row, so only a change to a non-zero value is an event. The count is a gauge
    per ``xid`` label over a sliding window; a rise is an event.

    Args:
        report_initial: whether a non-zero value seen for the first time is an event. False
            for a long-running scraper (the value may predate it); True for a one-shot read.
    """

    def __init__(self, *, report_initial: bool = False) -> None:
        self.report_initial = report_initial
        self._last_gauge: dict[tuple[str, ...], float] = {}
        self._last_count: dict[tuple[str, ...], float] = {}

    def gauge(self, labels: Mapping[str, str], value: float, time: float) -> Event | None:
        key = _identity(labels)
        previous = self._last_gauge.get(key)
        self._last_gauge[key] = value
        if value <= 0 or value == previous:
            return None
        if previous is None and not self.report_initial:
            return None
        return _xid_event(labels, int(value), time, via="xid_gauge", count=1)

    def count(self, labels: Mapping[str, str], value: float, time: float) -> Event | None:
        code = _int_or_none(labels.get("xid"))
        if code is None:
            return None
        key = (*_identity(labels), str(code))
        previous = self._last_count.get(key)
        self._last_count[key] = value
        # A series seen for the first time counts in full only for a one-shot read.
        new = (value if self.report_initial else 0.0) if previous is None else value - previous
        if new <= 0:
            return None
        return _xid_event(labels, code, time, via="xid_count", count=int(new))


def parse_exposition(
    text: str,
    *,
    time: float,
    labels: Mapping[str, str] | None = None,
    tracker: XidTracker | None = None,
    max_labels: int = DEFAULT_MAX_LABELS,
) -> Parsed:
    """Parses exporter text into Samples, XID events and counted drops; never raises on input.

    Args:
        text: the body of a ``/metrics`` scrape.
        time: the scrape time, used where a line carries no timestamp.
        labels: labels added to every sample (e.g. ``node`` when the exporter names none);
            the exporter's own labels win over them.
        tracker: keeps XID state between scrapes; a fresh one reports XIDs seen now.
        max_labels: series with more labels are dropped as ``too_many_labels``.

    Returns:
        Parsed samples (one per series, named as the exporter names them), XID events and
        drops by reason: ``malformed_line``, ``nan``, ``infinite``, ``dcgm_sentinel``,
        ``too_many_labels``.
    """
    tracker = tracker if tracker is not None else XidTracker(report_initial=True)
    extra = dict(labels or {})
    dropped: Counter[str] = Counter()
    samples: list[Sample] = []
    gauge_events: list[Event] = []
    count_events: list[Event] = []
    for name, raw_labels, value, stamp in _series(text, dropped):
        if len(raw_labels) > max_labels:
            dropped["too_many_labels"] += 1
            continue
        when = time if stamp is None else stamp
        series_labels = {**extra, **normalise_labels(raw_labels)}
        if name in (XID_GAUGE, XID_COUNT):
            reason = _reject(value)
            if reason:
                dropped[reason] += 1
                continue
            observe = tracker.gauge if name == XID_GAUGE else tracker.count
            event = observe(series_labels, value, when)
            if event is not None:
                (gauge_events if name == XID_GAUGE else count_events).append(event)
            continue
        reason = _reject(value)
        if reason:
            dropped[reason] += 1
            continue
        samples.append(Sample(name, value, when, series_labels))
    events = count_events + _not_counted(gauge_events, count_events)
    return Parsed(tuple(samples), tuple(events), dict(dropped))


def _series(text: str, dropped: Counter[str]) -> Iterator[tuple[str, dict[str, str], float, Any]]:
    """Every (name, labels, value, timestamp) the parser accepts, line by line on error."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception:
        # The parser stops at the first bad line; re-read line by line so one bad line
        # costs only itself. TYPE information is lost, which we do not use anyway.
        yield from _series_by_line(text, dropped)
        return
    for family in families:
        for s in family.samples:
            yield s.name, dict(s.labels), float(s.value), _stamp(s.timestamp)


def _series_by_line(
    text: str, dropped: Counter[str]
) -> Iterator[tuple[str, dict[str, str], float, Any]]:
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(stripped + "\n"))
        except Exception:
            dropped["malformed_line"] += 1
            continue
        for family in families:
            for s in family.samples:
                yield s.name, dict(s.labels), float(s.value), _stamp(s.timestamp)


def _stamp(timestamp: Any) -> float | None:
    if timestamp is None:
        return None
    try:
        return float(timestamp)
    except (TypeError, ValueError):
        return None


def _reject(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "infinite"
    if abs(value) >= SENTINEL_FLOOR:
        return "dcgm_sentinel"
    return ""


def _identity(labels: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(labels.get(k, "") for k in _GPU_IDENTITY)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _xid_event(labels: Mapping[str, str], code: int, time: float, *, via: str, count: int) -> Event:
    where = {k: labels[k] for k in _GPU_IDENTITY if labels.get(k)}
    info = lookup(code)
    return Event(
        "gpu_xid",
        time,
        float(code),
        {**where, **xid_labels(code), "via": via, "count": str(count)},
        info.name,
    )


def _not_counted(gauge_events: list[Event], count_events: list[Event]) -> list[Event]:
    """Gauge events the windowed count did not already report (both show one XID twice)."""
    seen = {(_identity(e.labels), e.value) for e in count_events}
    return [e for e in gauge_events if (_identity(e.labels), e.value) not in seen]
