"""Records of the checkpoint engine that cross its boundary.

States follow TRANSOM's checkpoint engine: a snapshot is PENDING while a trainer copies into
it, CACHED once complete in the holder's memory, BACKED_UP once the next node holds a copy,
PERSISTENT once durable in storage, OBSOLESCENT when evicted, BROKEN when incomplete.

>>> c = StateChange("node0", 7, 0, CkptState.CACHED, 12.5)
>>> StateChange.from_json(c.to_json()) == c
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class CkptState(StrEnum):
    """Lifecycle of one snapshot shard held by a node."""

    PENDING = "pending"
    CACHED = "cached"
    BACKED_UP = "backed_up"
    PERSISTENT = "persistent"
    OBSOLESCENT = "obsolescent"
    BROKEN = "broken"


#: States in which a snapshot is complete and may be loaded.
LOADABLE = frozenset({CkptState.CACHED, CkptState.BACKED_UP, CkptState.PERSISTENT})


class Tier(StrEnum):
    """Where a restored shard came from, fastest first."""

    MEMORY = "memory"  # the local node's holder
    PEER = "peer"  # another node's holder: its own shard or its backup of ours
    STORAGE = "storage"  # the persisted directory or fsspec URL


@dataclass(frozen=True, slots=True)
class StateChange:
    """One state transition of the shard ``shard`` of step ``step`` owned by ``node``.

    ``error`` is set when the transition (or a failed attempt at one) carries a reason,
    e.g. persistence failing on a full disk while the snapshot stays in memory.
    """

    node: str
    step: int
    shard: int
    state: CkptState
    time: float
    error: str = ""
    seq: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "step": self.step,
            "shard": self.shard,
            "state": self.state.value,
            "time": self.time,
            "error": self.error,
            "seq": self.seq,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateChange:
        return cls(
            str(data["node"]),
            int(data["step"]),
            int(data["shard"]),
            CkptState(data["state"]),
            float(data["time"]),
            str(data.get("error", "")),
            int(data.get("seq", 0)),
        )


@dataclass(frozen=True, slots=True)
class SaveResult:
    """What a save did. ``ok`` is False (with ``error``) instead of raising into training."""

    step: int
    ok: bool
    blocking_s: float
    nbytes: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class LoadResult:
    """A restored state, the step it belongs to and the tier each shard came from."""

    state: Any
    step: int
    tiers: tuple[Tier, ...]
    skipped: tuple[str, ...] = ()  # newer candidates rejected, with the reason

    @property
    def tier(self) -> Tier:
        """The slowest tier any shard came from (MEMORY < PEER < STORAGE)."""
        order = list(Tier)
        return max(self.tiers, key=order.index)
