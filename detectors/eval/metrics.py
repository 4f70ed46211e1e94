"""Event-level scoring of findings against labelled fault windows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detectors.eval.generate import HARD_KINDS
from detectors.eval.runner import Emitted
from detectors.eval.trace import FaultWindow, Trace, step_seconds, subject_label

#: Steps after a window's end in which a finding still counts as detecting it.
GRACE_STEPS = 10


@dataclass(frozen=True, slots=True)
class Match:
    """How one labelled window was detected (``found`` False: missed)."""

    window: FaultWindow
    found: bool
    localised: bool = False
    delay_steps: float = float("nan")
    delay_s: float = float("nan")


@dataclass(frozen=True)
class TraceResult:
    """Matches of one trace's windows, its unmatched findings, and its exposure."""

    matches: tuple[Match, ...]
    false_findings: tuple[Emitted, ...]
    findings: int
    node_days: float
    step_seconds: float
    released: tuple[int, ...] = ()  # the step at which each finding was released


def _in_window(e: Emitted, w: FaultWindow) -> bool:
    return w.start_step <= e.step <= w.end_step + GRACE_STEPS


def _subject_matches(e: Emitted, w: FaultWindow) -> bool:
    return subject_label(e.finding.subject) == w.subject


def score_trace(trace: Trace, emitted: Sequence[Emitted]) -> TraceResult:
    """Matches each window to its earliest finding of the same kind released inside it.

    A finding that matches no window of its kind is a false finding (a wrong kind inside
    a window included: it would have sent remediation the wrong way).
    """
    healthy = np.ones(len(trace.steps), dtype=bool)
    for w in trace.labels:
        healthy &= ~((trace.steps >= w.start_step) & (trace.steps <= w.end_step + GRACE_STEPS))
    step_s = step_seconds(trace.steps, trace.times) or 1.0  # 1 s without two steps
    used: set[int] = set()
    matches = []
    for w in trace.labels:
        hits = [i for i, e in enumerate(emitted) if e.finding.kind == w.kind and _in_window(e, w)]
        if not hits:
            matches.append(Match(w, False))
            continue
        used.update(hits)
        first = emitted[min(hits, key=lambda i: emitted[i].time)]
        onset = _onset_time(trace, w.start_step)
        delay_s = first.time - onset
        matches.append(Match(w, True, _subject_matches(first, w), delay_s / step_s, delay_s))
    false = tuple(e for i, e in enumerate(emitted) if i not in used)
    released = tuple(e.step for e in emitted)
    return TraceResult(tuple(matches), false, len(emitted), trace.node_days, step_s, released)


def _onset_time(trace: Trace, step: int) -> float:
    """When the fault's first step began: the end of the observation before the trace
    first reached it (a run restarted from a checkpoint goes over earlier steps again)."""
    reached = np.flatnonzero(trace.steps >= step)
    if not len(reached) or reached[0] == 0:
        return float(trace.times[0])
    return float(trace.times[reached[0] - 1])


@dataclass(frozen=True)
class ClassScore:
    kind: str
    windows: int
    detected: int
    findings: int
    false: int
    localised: int = 0
    delay_steps: float = float("nan")  # median over the detected windows
    delay_s: float = float("nan")

    @property
    def precision(self) -> float:
        return (self.findings - self.false) / self.findings if self.findings else 1.0

    @property
    def recall(self) -> float:
        return self.detected / self.windows if self.windows else 1.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def localisation(self) -> float:
        return self.localised / self.detected if self.detected else float("nan")


def class_scores(results: Sequence[TraceResult]) -> list[ClassScore]:
    """Event-level precision, recall, F1, localisation and delay per fault class."""
    kinds = sorted(
        {m.window.kind for r in results for m in r.matches}
        | {e.finding.kind for r in results for e in r.false_findings}
    )
    out = []
    for kind in kinds:
        matches = [m for r in results for m in r.matches if m.window.kind == kind]
        found = [m for m in matches if m.found]
        false = sum(1 for r in results for e in r.false_findings if e.finding.kind == kind)
        detected = len(found)
        out.append(
            ClassScore(
                kind,
                len(matches),
                detected,
                detected + false,
                false,
                sum(m.localised for m in found),
                float(np.median([m.delay_steps for m in found])) if found else float("nan"),
                float(np.median([m.delay_s for m in found])) if found else float("nan"),
            )
        )
    return out


def summary(
    results: Sequence[TraceResult], healthy: Sequence[TraceResult] = ()
) -> dict[str, float]:
    """Headline numbers: macro F1, localisation, median delays, false alarms per node-day."""
    found = [m for r in results for m in r.matches if m.found]
    hard = [m.delay_steps for m in found if m.window.kind in HARD_KINDS]
    slow = [m.delay_steps for m in found if m.window.kind not in HARD_KINDS]
    scores = class_scores(results)
    exposure = sum(r.node_days for r in healthy)
    alarms = sum(r.findings for r in healthy)
    return {
        "min_class_f1": min((s.f1 for s in scores), default=float("nan")),
        "macro_f1": float(np.mean([s.f1 for s in scores])) if scores else float("nan"),
        "localisation": float(np.mean([m.localised for m in found])) if found else float("nan"),
        "median_delay_hard_steps": float(np.median(hard)) if hard else float("nan"),
        "median_delay_failslow_steps": float(np.median(slow)) if slow else float("nan"),
        "median_delay_s": float(np.median([m.delay_s for m in found])) if found else float("nan"),
        "healthy_node_days": exposure,
        "false_alarms_per_node_day": alarms / exposure if exposure else float("nan"),
        "pointwise_f1": pointwise_f1(results),
        "pointwise_f1_point_adjusted": pointwise_f1_adjusted(results),
    }


def pointwise_f1(results: Sequence[TraceResult]) -> float:
    """Plain point-wise F1 over steps, without point adjustment: a step is flagged when a
    finding was released at it, a step is positive when it lies in a labelled window. An
    event detector that fires once per fault scores low here by design."""
    tp = fp = fn = 0
    for r in results:
        truth = {s for m in r.matches for s in range(m.window.start_step, m.window.end_step + 1)}
        flagged = set(r.released)
        tp += len(flagged & truth)
        fp += len(flagged - truth)
        fn += len(truth - flagged)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def pointwise_f1_adjusted(results: Sequence[TraceResult]) -> float:
    """Point-wise F1 over steps with point adjustment: a step is flagged from a finding's
    release to its window's end.

    Without that adjustment an event detector that fires once per fault would score near
    zero (see ``pointwise_f1``); the adjustment credits a window's steps only after the
    detection. It is named so wherever it is reported.
    """
    tp = fp = fn = 0
    for r in results:
        for m in r.matches:
            length = m.window.end_step - m.window.start_step + 1
            caught = 0
            if m.found:
                caught = max(0, min(length, length - int(np.ceil(m.delay_steps)) + 1))
            tp += caught
            fn += length - caught
        fp += len(r.false_findings)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0
