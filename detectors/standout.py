"""A rank that stands out against its own host, step after step.

The agents reduce telemetry on the host and send the controller the raw values of only
the ranks that stand out against the host's median, each beside that median
(``<feature>.host_median``). This detector judges those rows: a rank whose compute time
(or data wait) is ``min_shift`` above its host's median, and ``min_abs`` milliseconds
above it, for ``persistence`` consecutive steps is a slow rank (or a data-loader stall),
the same bar as the live peer comparison; a data wait's excess must also be ``step_share``
of the host's median step (a wait of 40 ms against 20 on a 3.5 s step costs nothing). One
finding per run of steps standing out, for each rank and feature; a new run is named
only ``clear_steps`` after the last finding.

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
#: The share of the step a feature's excess must also reach (the live peer comparison's).
STEP_SHARE = {"data_wait_ms": 0.02}


class StandsOut:
    """Args:
    min_shift: how far above the host's median, relatively (0.5: 50 % more).
    min_abs: how far above it at least, in the feature's unit (milliseconds).
    persistence: consecutive steps standing out before a finding.
    clear_steps: steps before the same rank and feature are named again.
    step_share: per feature, the share of the host's median step time (``step_time``, in
        seconds, beside the row) its excess must reach as well.
    """

    name = "host_outlier"

    def __init__(
        self,
        min_shift: float = 0.5,
        min_abs: float = 20.0,
        persistence: int = 4,  # the live comparison's three of five steps, held two
        clear_steps: int = 50,
        step_share: dict[str, float] | None = None,
    ) -> None:
        self.min_shift, self.min_abs = min_shift, min_abs
        self.step_share = STEP_SHARE if step_share is None else step_share
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
            floor = self.min_abs
            share, step_s = self.step_share.get(feature), _step_s(frame)
            if share is not None and step_s is not None:
                floor = max(floor, share * 1000.0 * step_s)
            if value < median * (1 + self.min_shift) or value - median < floor:
                self._runs.pop(key, None)
                continue
            count, last = self._runs.get(key, (0, step - 1))
            count = count + 1 if last == step - 1 else 1
            self._runs[key] = (count, step)
            named = self._named.get(key)
            # once per run of steps standing out (a stall of a hundred steps is one fault),
            # and a new run not within ``clear_steps`` of the last finding
            if count == self.persistence and (named is None or step - named > self.clear_steps):
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


def _step_s(frame: Frame) -> float | None:
    """The host's median step time beside the row (the rank's own when alone), seconds."""
    step_s = frame.values.get("step_time.host_median", frame.values.get("step_time"))
    return step_s if step_s is not None and math.isfinite(step_s) else None


__all__ = ["StandsOut"]
