"""A rank that stands out against its own host, step after step.

The agents reduce telemetry on the host and send the controller the raw values of only
the ranks that stand out against the host's median, each beside that median
(``<feature>.host_median``). This detector judges those rows: a rank whose compute time
(or data wait) is ``min_shift`` above its host's median, and ``min_abs`` milliseconds
above it, for ``persistence`` consecutive steps is a slow rank (or a data-loader stall),
the same bar as the live peer comparison. One finding per rank and feature, again only
``clear_steps`` after the last.

>>> from collector.types import Frame, Subject
>>> det = StandsOut(persistence=2)
>>> rows = [{"compute_ms": 300.0, "compute_ms.host_median": 100.0}] * 3
>>> found = [f for s, v in enumerate(rows) for f in det.process(Frame(Subject(0, 5), s, 0.0, v))]
>>> [(f.kind, f.subject.rank, f.step) for f in found]
[('slow_rank', 5, 1)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from collector.types import Frame
from detectors.types import Finding, Severity

FEATURES = {"compute_ms": "slow_rank", "data_wait_ms": "dataloader_stall"}


class StandsOut:
    """Args:
    min_shift: how far above the host's median, relatively (0.5: 50 % more).
    min_abs: how far above it at least, in the feature's unit (milliseconds).
    persistence: consecutive steps standing out before a finding.
    clear_steps: steps before the same rank and feature are named again.
    """

    name = "host_outlier"

    def __init__(
        self,
        min_shift: float = 0.5,
        min_abs: float = 20.0,
        persistence: int = 3,
        clear_steps: int = 50,
    ) -> None:
        self.min_shift, self.min_abs = min_shift, min_abs
        self.persistence, self.clear_steps = persistence, clear_steps
        self._runs: dict[tuple[int, str], tuple[int, int]] = {}  # -> (steps, last step)
        self._named: dict[tuple[int, str], int] = {}

    def process(self, frame: Frame) -> Sequence[Finding]:
        rank, step = frame.subject.rank, frame.step
        if rank is None or step is None:
            return ()
        found = []
        for feature, kind in FEATURES.items():
            value = frame.values.get(feature)
            median = frame.values.get(f"{feature}.host_median")
            if value is None or median is None or not math.isfinite(value + median):
                continue
            key = (rank, feature)
            if value < median * (1 + self.min_shift) or value - median < self.min_abs:
                self._runs.pop(key, None)
                continue
            count, last = self._runs.get(key, (0, step - 1))
            count = count + 1 if last == step - 1 else 1
            self._runs[key] = (count, step)
            named = self._named.get(key)
            if count >= self.persistence and (named is None or step - named > self.clear_steps):
                self._named[key] = step
                evidence = {feature: value, "host_median": median, "steps": float(count)}
                score = value / median if median > 0 else math.inf
                found.append(
                    Finding(
                        kind,
                        frame.subject,
                        score,
                        Severity.WARN,
                        frame.time,
                        step,
                        evidence,
                        self.name,
                    )  # fmt: skip
                )
        return found

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


__all__ = ["StandsOut"]
