"""Runs a detector pipeline over a trace, recording when each finding came out."""

from __future__ import annotations

from dataclasses import dataclass

from detectors.config import DetectorsConfig
from detectors.eval.trace import Trace
from detectors.types import Finding


@dataclass(frozen=True, slots=True)
class Emitted:
    """A finding and the position in the trace at which the pipeline released it."""

    finding: Finding
    step: int
    time: float


def run_trace(trace: Trace, config: DetectorsConfig | None = None) -> list[Emitted]:
    """Feeds every observation of the trace to a fresh pipeline, in time order."""
    pipeline = (config or DetectorsConfig()).build()
    out: list[Emitted] = []
    step, time = 0, 0.0
    for batch in trace.batches():
        step, time = batch.step, batch.time
        out += [Emitted(f, step, time) for f in pipeline.process_step(batch)]
    out += [Emitted(f, step, time) for f in pipeline.flush()]
    return out
