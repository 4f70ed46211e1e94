"""Events, and what every parser of the collector returns.

A level (a gauge that keeps its value) and an event (something that happened once: an XID,
a collective timeout) must not be confused: a sticky "last XID" gauge read as a level fires
forever. Parsers turn such signals into :class:`Event` records, and report what they could
not read as counted drops instead of raising.

>>> e = Event("gpu_xid", 12.0, 79.0, {"gpu": "0"}, "GPU has fallen off the bus")
>>> Event.from_json(e.to_json()) == e
True
>>> e.to_sample().name, e.to_sample().value
('gpu_xid', 79.0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from collector.types import Sample

#: Label values longer than this are cut: a runaway label must not blow up memory or a store.
MAX_LABEL_VALUE = 256


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened once, at a time, somewhere.

    Attributes:
        kind: what happened, e.g. ``gpu_xid``, ``nccl_timeout``, ``nccl_pending_collective``.
        time: seconds since the epoch when it was seen (or when the source says it happened).
        value: the event's number: the XID code, the collective's sequence number.
        labels: where: node, gpu, pci, rank, process group, op.
        message: the human text that came with it (the tail of a log line).
    """

    kind: str
    time: float
    value: float = 1.0
    labels: Mapping[str, str] = field(default_factory=dict)
    message: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    def to_sample(self) -> Sample:
        """The event as one Sample (name = kind), for sinks that only take Samples."""
        return Sample(self.kind, self.value, self.time, self.labels)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "time": self.time,
            "value": self.value,
            "labels": dict(self.labels),
            "message": self.message,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        return cls(
            kind=str(data["kind"]),
            time=float(data["time"]),
            value=float(data.get("value", 1.0)),
            labels={str(k): str(v) for k, v in data.get("labels", {}).items()},
            message=str(data.get("message", "")),
        )


@dataclass(frozen=True, slots=True)
class Parsed:
    """What a parser read: levels as Samples, happenings as Events, and counted drops.

    Attributes:
        samples: measurements that are levels or counters.
        events: things that happened once.
        dropped: reason -> number of lines, series or records skipped for that reason.
    """

    samples: tuple[Sample, ...] = ()
    events: tuple[Event, ...] = ()
    dropped: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dropped", MappingProxyType(dict(self.dropped)))

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())

    def all_samples(self) -> list[Sample]:
        """Samples followed by the events as Samples: what a Source's collect() yields."""
        return [*self.samples, *(e.to_sample() for e in self.events)]

    @classmethod
    def merge(cls, parts: Iterable[Parsed]) -> Parsed:
        samples: list[Sample] = []
        events: list[Event] = []
        dropped: Counter[str] = Counter()
        for part in parts:
            samples.extend(part.samples)
            events.extend(part.events)
            dropped.update(part.dropped)
        return cls(tuple(samples), tuple(events), dict(dropped))


def clean_label(value: object) -> str:
    """A label value as a bounded, printable string."""
    text = str(value)
    if len(text) > MAX_LABEL_VALUE:
        text = text[: MAX_LABEL_VALUE - 3] + "..."
    return text
