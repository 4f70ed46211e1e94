"""A real TrainingHook whose batches land in a list, read back per step."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from collector.hooks import TrainingHook


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.hook = TrainingHook(lambda labels, rows: self.batches.append(list(rows)) or True, {})

    def steps(self) -> dict[int, dict[str, float]]:
        """{step: {metric: value}} of everything the hook sent, once it is flushed."""
        self.hook.close()
        out: dict[int, dict[str, float]] = defaultdict(dict)
        for batch in self.batches:
            for name, value, _time, step, *_ in batch:
                out[step][name] = value
        return dict(out)
