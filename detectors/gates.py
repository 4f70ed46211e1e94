"""Gates turn a StreamingDetector's scores into findings (river's AnomalyFilter idea).

Thresholding is not scoring: a scorer says how unusual a frame is, a gate decides whether
that is a finding. By default a gate does not let anomalous frames update the scorer, so a
lasting fault does not become the new normal (``protect``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from collector.types import Frame
from detectors.base import StreamingDetector
from detectors.types import Finding, Severity


class ThresholdGate:
    """A finding of ``kind`` whenever the score reaches ``threshold``.

    >>> from detectors.numerics import SeriesSpike
    >>> gate = ThresholdGate(SeriesSpike(warmup=3), threshold=8.0, kind="loss_spike")
    >>> from collector.types import Frame, JOB
    >>> _ = [gate.process(Frame(JOB, s, 0.0, {"loss": 1.0 + 0.01 * (s % 2)})) for s in range(9)]
    >>> [f.kind for f in gate.process(Frame(JOB, 9, 0.0, {"loss": 9.0}))]
    ['loss_spike']
    """

    def __init__(
        self,
        scorer: StreamingDetector,
        threshold: float,
        kind: str = "anomaly",
        name: str = "threshold_gate",
        protect: bool = True,
        severity: str = "warn",
    ) -> None:
        self.scorer, self.threshold, self.kind = scorer, threshold, kind
        self.name, self.protect, self.severity = name, protect, Severity(severity)

    def threshold_for(self, score: float) -> float:
        return self.threshold

    def process(self, frame: Frame) -> Sequence[Finding]:
        score = self.scorer.score_one(frame)
        limit = self.threshold_for(score)
        anomalous = np.isfinite(score) and score >= limit
        if not (anomalous and self.protect):
            self.scorer.learn_one(frame)
        if not anomalous:
            return ()
        evidence = {k: float(v) for k, v in frame.values.items()}
        evidence["score"], evidence["threshold"] = float(score), float(limit)
        return (
            Finding(
                self.kind,
                frame.subject,
                float(score),
                self.severity,
                frame.time,
                frame.step,
                evidence,
                self.name,
            ),
        )

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


class QuantileGate(ThresholdGate):
    """Fires when the score exceeds the ``q`` quantile of its recent scores.

    The detector picks its own threshold from the scores it has seen and did not flag
    (a long anomaly must not raise the bar it is judged by): nothing labelled is needed.
    No finding during the first ``warmup`` scores.

    Raises:
        ValueError: q outside [0.5, 1), or a warm-up longer than the history kept (the
            gate could never fire).
    """

    def __init__(
        self,
        scorer: StreamingDetector,
        q: float = 0.999,
        kind: str = "anomaly",
        name: str = "quantile_gate",
        window: int = 4096,
        warmup: int = 64,
        margin: float = 1.0,
        protect: bool = True,
    ) -> None:
        if not 0.5 <= q < 1.0:
            raise ValueError(f"q must be in [0.5, 1), got {q}")
        if warmup > window:
            raise ValueError(f"warmup ({warmup}) exceeds the scores kept ({window}): never fires")
        super().__init__(scorer, float("inf"), kind, name, protect)
        self.q, self.warmup, self.margin = q, warmup, margin
        self._scores: deque[float] = deque(maxlen=window)

    def threshold_for(self, score: float) -> float:
        enough = len(self._scores) >= self.warmup
        limit = float(np.quantile(self._scores, self.q)) * self.margin if enough else np.inf
        limit = limit if limit > 0 else np.inf
        if np.isfinite(score) and score < limit:  # what it flags never raises its own bar
            self._scores.append(score)
        return limit
