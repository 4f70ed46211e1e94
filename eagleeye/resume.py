"""The resume contract: which checkpoint a restarted attempt starts from.

Every checkpoint a rank reports (the hook's saves, or the script's own ``torch.save``
through the zero-code telemetry) is noted; a step is complete once every rank that saves
has reported it. On a job restart the newest complete one is handed to the ranks as
``EAGLEEYE_RESUME_FROM`` (the hook's ``load_checkpoint()`` finds it by itself), and the
script's own resume flags (``--resume-args``) are appended to its command.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from collector.types import Sample


class KnownCheckpoints:
    """The disk checkpoints the ranks reported, by step."""

    def __init__(self) -> None:
        self._paths: dict[int, dict[int, str]] = {}  # step → rank → path
        self._savers: set[int] = set()

    def observe(self, samples: Iterable[Sample]) -> None:
        for sample in samples:
            if sample.name != "event.checkpoint" or sample.labels.get("tier", "disk") != "disk":
                continue
            path, rank = sample.labels.get("path"), sample.labels.get("rank", "")
            if not path or not rank.isdigit() or not math.isfinite(sample.value):
                continue
            self.note(int(rank), int(sample.value), path)

    def note(self, rank: int, step: int, path: str) -> None:
        self._savers.add(rank)
        self._paths.setdefault(step, {})[rank] = path

    def note_all(self, saved: Iterable[tuple[int, int, str]]) -> None:
        """Checkpoints known from elsewhere (a resumed run's store): (rank, step, path)."""
        for rank, step, path in saved:
            self.note(rank, step, path)

    def newest(self) -> str | None:
        """The path of the newest step every saving rank has reported, or None."""
        for step in sorted(self._paths, reverse=True):
            by_rank = self._paths[step]
            if self._savers <= by_rank.keys():
                return by_rank[min(by_rank)]
        return None
