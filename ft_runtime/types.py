"""The runtime's vocabulary: actions it accepts, outcomes it returns, lifecycle events it emits.

Remediation imports these records; nothing here imports the rest of Eagle Eye, so the
runtime stays usable on its own. Targets are plain strings ("job", "replica:1", "rank:3",
"node:node1") so the runtime needs no other package's types.

>>> a = Action(ActionKind.RESTART, "job", "rank 3 exited", "restart/job/1")
>>> Action.from_json(a.to_json()) == a
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any


class ActionKind(StrEnum):
    CHECKPOINT = "checkpoint"
    EVICT = "evict"
    RESTART = "restart"
    ISOLATE = "isolate"
    ROLLBACK = "rollback"
    SKIP_BATCH = "skip_batch"
    NOTIFY = "notify"


class OutcomeStatus(StrEnum):
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"
    PENDING = "pending"
    """Under way (a command the ranks have not all answered yet): the runtime's
    ``outcomes()`` yields the final Outcome of the same action later."""


@dataclass(frozen=True, slots=True)
class Action:
    """A command for the runtime. ``key`` makes repeats idempotent: same key twice, one effect.
    ``params`` are the policy's numbers for it, as sorted (name, value) pairs (a rollback's
    ``lr_factor``)."""

    kind: ActionKind
    target: str
    reason: str
    key: str
    params: tuple[tuple[str, float], ...] = ()

    def param(self, name: str, default: float) -> float:
        return dict(self.params).get(name, default)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind.value,
            "target": self.target,
            "reason": self.reason,
            "key": self.key,
        }
        if self.params:
            out["params"] = dict(self.params)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Action:
        params = tuple(sorted((str(k), float(v)) for k, v in data.get("params", {}).items()))
        return cls(
            ActionKind(data["kind"]),
            str(data["target"]),
            str(data["reason"]),
            str(data["key"]),
            params,
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of an action: a status, a line for people (``detail``) and, beside it,
    the same facts as structured ``data`` for programs (a checkpoint's step and path, each
    replica's answer, who never answered), JSON-serialisable values only.

    >>> o = Outcome(Action(ActionKind.CHECKPOINT, "job", "r", "k"), OutcomeStatus.DONE,
    ...             "saved step 4", 1.0, {"step": 4})
    >>> Outcome.from_json(o.to_json()) == o, o.data["step"], o.final
    (True, 4, True)
    """

    action: Action
    status: OutcomeStatus
    detail: str
    time: float
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", MappingProxyType(dict(self.data)))

    @property
    def final(self) -> bool:
        """Whether this is what became of the action (not a pending one)."""
        return self.status is not OutcomeStatus.PENDING

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.action.to_json(),
            "status": self.status.value,
            "detail": self.detail,
            "time": self.time,
        }
        if self.data:
            out["data"] = dict(self.data)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Outcome:
        return cls(
            Action.from_json(data["action"]),
            OutcomeStatus(data["status"]),
            str(data["detail"]),
            float(data["time"]),
            dict(data.get("data", {})),
        )


class Phase(StrEnum):
    """Lifecycle phases of a job, a replica or a rank (TRANSOM's TOL)."""

    LAUNCH = "launch"
    PRE_CHECK = "pre_check"
    RUNNING = "running"
    EXITED = "exited"
    RECOVERING = "recovering"
    EVICTED = "evicted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """A phase change of a subject ("job", "replica:1", "rank:3"), with details."""

    subject: str
    phase: Phase
    time: float
    attempt: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "phase": self.phase.value,
            "time": self.time,
            "attempt": self.attempt,
            "detail": dict(self.detail),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LifecycleEvent:
        return cls(
            str(data["subject"]),
            Phase(data["phase"]),
            float(data["time"]),
            int(data.get("attempt", 0)),
            dict(data.get("detail", {})),
        )
