"""A replica's answer to a control command, parsed into a typed record in one place.

Rank 0 of each replica answers command ``n`` under the command's answer key with a JSON
object: ``{"saved": step, "path": p}`` (``saved`` -1: nothing saved),
``{"restored": step, ...}``, ``{"skipped": batch}`` (-1: not addressed), or
``{"error": text}``. Anything else is a malformed answer, kept as a failure that says so
rather than raised: one replica's bad answer must not take the controller down.

>>> parse_answer(1, b'{"saved": 40, "path": "/ckpt/40"}')
Answer(replica=1, kind='saved', step=40, path='/ckpt/40', error='')
>>> parse_answer(0, b'{"error": "no checkpoint at or before 2"}').kind
'failed'
>>> parse_answer(0, b'[1]').error
'malformed answer: [1]'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SAVED, RESTORED, SKIPPED, FAILED = "saved", "restored", "skipped", "failed"


@dataclass(frozen=True, slots=True)
class Answer:
    """One replica's answer: ``kind`` is saved, restored, skipped or failed; ``step`` the
    step saved or restored, or the batch skipped (-1: none); ``path`` where a checkpoint
    went; ``error`` why it failed."""

    replica: int
    kind: str
    step: int = -1
    path: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "step": self.step}
        if self.path:
            out["path"] = self.path
        if self.error:
            out["error"] = self.error
        return out


def parse_answer(replica: int, raw: bytes | str) -> Answer:
    """The typed answer of ``replica`` from the bytes it wrote."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(text)
        if "error" in data:
            return Answer(replica, FAILED, error=str(data["error"]))
        for kind in (SAVED, RESTORED, SKIPPED):
            if kind in data:
                return Answer(replica, kind, int(data[kind]), str(data.get("path", "")))
    except (ValueError, TypeError):
        pass
    return Answer(replica, FAILED, error=f"malformed answer: {text[:200]}")
