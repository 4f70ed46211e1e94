"""Membership records of the quorum, without torch: what the coordinator decides and logs.

>>> m = Membership(3, (0, 2), joining=(2,))
>>> Membership.from_json(3, m.to_json()) == m, m.source
(True, 0)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Membership:
    """One epoch: the replicas that exchange gradients, and those joining with zeros."""

    epoch: int
    members: tuple[int, ...]
    joining: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"members": list(self.members), "joining": list(self.joining)})

    @classmethod
    def from_json(cls, epoch: int, text: str | bytes) -> Membership:
        data = json.loads(text)
        return cls(epoch, tuple(data["members"]), tuple(data.get("joining", ())))

    @property
    def source(self) -> int:
        """The replica a joiner fetches its state from: the lowest healthy member."""
        healthy = [r for r in self.members if r not in self.joining]
        return min(healthy) if healthy else -1


@dataclass(frozen=True, slots=True)
class QuorumRecord:
    """What a coordinator must know to resume: the newest membership, the incarnations it
    admits, and where the store the ranks talk to listens."""

    membership: Membership
    store_address: str
    expected: dict[int, int] = field(default_factory=dict)


class MembershipLog(Protocol):
    """Durable memory of the coordinator; ``record`` returns once the record is stored."""

    def record(self, record: QuorumRecord, time: float) -> None: ...

    def last(self) -> QuorumRecord | None: ...
