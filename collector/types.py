"""Records the collector hands to the rest of Eagle Eye.

Every record is a frozen dataclass that converts to and from plain JSON data, so it can
cross process boundaries, land in the run store and be replayed later.

>>> s = Sample("loss", 2.5, 10.0, {"rank": "0"}, step=3)
>>> Sample.from_json(s.to_json()) == s
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


def json_float(value: float) -> float | str:
    """JSON has no NaN or infinity; spell them as strings so they survive a round trip."""
    if math.isfinite(value):
        return value
    return repr(value)


def _from_json_float(value: float | str) -> float:
    return float(value)


@dataclass(frozen=True, slots=True)
class Subject:
    """Where something happened: a job, a replica, a node or one rank.

    The most specific field set names the subject: a rank beats a node, a node beats a
    replica, and a subject with none of them is the whole job.
    """

    replica: int | None = None
    rank: int | None = None
    node: str | None = None

    @property
    def scope(self) -> str:
        if self.rank is not None:
            return "rank"
        if self.node is not None:
            return "node"
        if self.replica is not None:
            return "replica"
        return "job"

    def __str__(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        if self.node is not None:
            return f"node {self.node}"
        if self.replica is not None:
            return f"replica {self.replica}"
        return "job"

    def to_json(self) -> dict[str, Any]:
        return {"replica": self.replica, "rank": self.rank, "node": self.node}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Subject:
        return cls(replica=data.get("replica"), rank=data.get("rank"), node=data.get("node"))


JOB = Subject()


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement: a named value at a time, with labels (job, replica, rank, node, gpu)."""

    name: str
    value: float
    time: float
    labels: Mapping[str, str] = field(default_factory=dict)
    step: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen(self.labels))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": json_float(self.value),
            "time": self.time,
            "labels": dict(self.labels),
            "step": self.step,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sample:
        return cls(
            name=str(data["name"]),
            value=_from_json_float(data["value"]),
            time=float(data["time"]),
            labels={str(k): str(v) for k, v in data.get("labels", {}).items()},
            step=None if data.get("step") is None else int(data["step"]),
        )


@dataclass(frozen=True, slots=True)
class Frame:
    """What detectors consume: named features of one subject at one step."""

    subject: Subject
    step: int | None
    time: float
    values: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _frozen(self.values))

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject.to_json(),
            "step": self.step,
            "time": self.time,
            "values": {k: json_float(v) for k, v in self.values.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Frame:
        return cls(
            subject=Subject.from_json(data["subject"]),
            step=None if data.get("step") is None else int(data["step"]),
            time=float(data["time"]),
            values={str(k): _from_json_float(v) for k, v in data.get("values", {}).items()},
        )
