"""Shared by the framework-callback tests: a real TrainingHook whose batches land in a
list, and the error a callback factory gives when its framework is missing."""

from __future__ import annotations

import subprocess
import sys
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


def pauses(recorder: Recorder) -> list[tuple[str, float]]:
    """The pause rows the hook sent, in order: (pause name, 1 begun or 0 ended)."""
    recorder.hook.close()
    rows = [row for batch in recorder.batches for row in batch if row[0] == "pause"]
    return [(row[4]["pause"], row[1]) for row in rows]


def missing_framework_error(hidden: tuple[str, ...], factory: str, check: str = "") -> str:
    """In a fresh interpreter that cannot import the ``hidden`` modules (after running
    ``check``), the message of ``MissingFrameworkError`` raised by ``factory(None)``."""
    code = (
        "import sys\n"
        f"{check}"
        + "".join(f"sys.modules[{name!r}] = None\n" for name in hidden)
        + f"from collector.frameworks import MissingFrameworkError, {factory}\n"
        "try:\n"
        f"    {factory}(None)\n"
        "except MissingFrameworkError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout
