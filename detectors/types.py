"""Records the detectors hand to remediation, the store and the dashboard.

>>> from collector.types import Subject
>>> f = Finding("process_exit", Subject(rank=3), 1.0, Severity.CRITICAL, 5.0, 40,
...             {"exit_code": -9.0}, "process_exit")
>>> Finding.from_json(f.to_json()) == f
True

JSON has no NaN or infinity: a non-finite score or evidence value is written as a string
(``"nan"``, ``"inf"``, ``"-inf"``), as a Frame's values are, and read back as the float.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from collector.types import Subject, json_float


class Severity(StrEnum):
    """How bad a finding is; remediation policies key on it."""

    INFO = "info"
    WARN = "warn"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Finding:
    """What is wrong (kind), where (subject) and why (evidence: features and their values).

    Higher ``score`` means more anomalous. ``detector`` is the registry name of the detector
    that produced it.
    """

    kind: str
    subject: Subject
    score: float
    severity: Severity
    time: float
    step: int | None
    evidence: Mapping[str, float] = field(default_factory=dict)
    detector: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", MappingProxyType(dict(self.evidence)))

    @property
    def key(self) -> str:
        """Identifies the fault this finding is about, for deduplication."""
        return f"{self.kind}/{self.subject.scope}/{self.subject}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject": self.subject.to_json(),
            "score": json_float(self.score),
            "severity": self.severity.value,
            "time": self.time,
            "step": self.step,
            "evidence": {k: json_float(v) for k, v in self.evidence.items()},
            "detector": self.detector,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        return cls(
            kind=str(data["kind"]),
            subject=Subject.from_json(data["subject"]),
            score=float(data["score"]),
            severity=Severity(data["severity"]),
            time=float(data["time"]),
            step=None if data.get("step") is None else int(data["step"]),
            evidence={str(k): float(v) for k, v in data.get("evidence", {}).items()},
            detector=str(data.get("detector", "")),
        )
