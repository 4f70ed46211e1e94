"""Control commands from the supervisor to the ranks of a replica-recovery job.

The supervisor writes command n under ``ctl/<n>`` in the quorum's store and counts them in
``ctl/count``. Every rank reports the count it has seen in its next exchange; the maximum
over the members is the agreed count, so every member runs the same commands after the
same step. Rank 0 of each replica answers under ``ctl/<n>/r<replica>``.

>>> c = Command(3, "rollback", step=40, replicas=(0, 2))
>>> Command.from_json(3, c.to_json()) == c
True
"""

from __future__ import annotations

import json
from dataclasses import dataclass

KEY_COMMANDS = "ctl/count"
CHECKPOINT, ROLLBACK, SKIP_BATCH = "checkpoint", "rollback", "skip_batch"
KINDS = (CHECKPOINT, ROLLBACK, SKIP_BATCH)


def key_command(number: int) -> str:
    return f"ctl/{number}"


def key_answer(number: int, replica: int) -> str:
    return f"ctl/{number}/r{replica}"


@dataclass(frozen=True, slots=True)
class Command:
    """One command: ``checkpoint`` (the lowest healthy replica saves), ``rollback`` to the
    newest checkpoint at or before ``step`` (the learning rate then multiplied by
    ``lr_factor``), ``skip_batch`` (``replicas`` skip their next batch; empty means all)."""

    number: int
    kind: str
    step: int = -1
    replicas: tuple[int, ...] = ()
    lr_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown control command {self.kind!r}; use one of {KINDS}")

    def applies_to(self, replica: int) -> bool:
        return not self.replicas or replica in self.replicas

    def to_json(self) -> str:
        data = {"kind": self.kind, "step": self.step, "replicas": list(self.replicas)}
        if self.lr_factor != 1.0:
            data["lr_factor"] = self.lr_factor
        return json.dumps(data)

    @classmethod
    def from_json(cls, number: int, text: str | bytes) -> Command:
        data = json.loads(text)
        lr_factor = float(data.get("lr_factor", 1.0))
        return cls(number, data["kind"], int(data["step"]), tuple(data["replicas"]), lr_factor)
