"""DetectorPipeline: runs every detector and fuses their findings (see detectors.fusion)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import reduce
from typing import Any

import numpy as np

from collector.types import JOB, Frame, Subject
from detectors.base import Detector
from detectors.edge import Edge
from detectors.fusion import (
    CAUSES,
    EXPLAINED_BY,
    GENERIC,
    JOB_WIDE,
    SYMPTOMS,
    FusionPolicy,
    Incident,
    covers,
    merge,
    ordered,
    when,
)
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity

log = logging.getLogger(__name__)


class Fuser:
    """Turns a stream of raw findings into one finding per fault (rules in detectors.fusion)."""

    def __init__(self, policy: FusionPolicy | None = None) -> None:
        self.policy = policy or FusionPolicy()
        self.incidents: list[Incident] = []
        self.suppressed = 0
        self._opened: dict[Subject, deque[float]] = {}
        self._history: deque[Incident] = deque(maxlen=1024)  # closed incidents, for symptoms
        self._noted: list[Incident] = []  # findings released outside fusion

    def add(self, finding: Finding) -> list[Finding]:
        """Takes one raw finding; returns the findings released now."""
        now = when(finding)
        self._expire(now)
        if finding.kind in SYMPTOMS and self._explained(finding, now):
            return []
        if finding.kind in GENERIC and self._on_a_fault_still_on(finding, now):
            return []
        if self._noted_already(finding, now):
            return []
        if self._found_by_another(finding, now):
            self.suppressed += 1
            return []
        if self._caused(finding, now):
            return []
        finding = self._absorb_held_effects(finding, now)
        if finding.kind not in SYMPTOMS:
            finding = self._absorb_held_symptoms(finding)
        for inc in self.incidents:
            same_job_wide = (
                finding.kind in JOB_WIDE
                and inc.finding.kind == finding.kind
                and inc.finding.subject.scope == "job"
            )
            related = (
                same_job_wide
                or covers(inc.finding.subject, finding.subject)
                or covers(finding.subject, inc.finding.subject)
            )
            if related and self._absorb(inc, finding, now):
                return self._release_critical()
        if self._flapping(finding.subject, now):
            self.suppressed += 1
            return []
        self.incidents.append(Incident(finding, now, released=False, opened_at=now))
        return self._release_critical()

    def note(self, finding: Finding) -> None:
        """Takes a finding released outside fusion (a hard rule answered at once): it
        explains the symptoms near it, and a finding of the same kind about the same subject
        within ``clear_steps`` is its duplicate and is dropped. Other kinds on that subject
        are other faults and go on as usual. Findings without a step are ignored: the
        fusion clock counts steps."""
        if finding.step is None:
            return
        now = when(finding)
        noted = Incident(finding, now, released=True, opened_at=now)
        self._history.append(noted)  # where symptoms look for their cause
        self._noted.append(noted)

    def _caused(self, finding: Finding, now: float) -> bool:
        """Whether an incident of a kind that causes this one (``CAUSES``) opened within
        ``hold_steps``, on any subject: one rank's NaN or loss spike is every rank's
        gradient spike after the all-reduce. The effect is merged into its cause."""
        causes = CAUSES.get(finding.kind)
        if not causes:
            return False
        for inc in [*self.incidents, *self._noted]:
            if inc.finding.kind in causes and abs(now - inc.opened_at) <= self.policy.hold_steps:
                if not inc.released:
                    inc.finding = merge(inc.finding, finding)
                return True
        return False

    def _absorb_held_effects(self, cause: Finding, now: float) -> Finding:
        """Held effects of this cause (a gradient spike reported a moment before the rank's
        loss spike that caused it) merge into it."""
        held = [
            inc
            for inc in self.incidents
            if not inc.released
            and cause.kind in CAUSES.get(inc.finding.kind, ())
            and abs(now - inc.opened_at) <= self.policy.hold_steps
        ]
        for inc in held:
            self.incidents.remove(inc)
            cause = merge(cause, inc.finding)
        return cause

    def _noted_already(self, finding: Finding, now: float) -> bool:
        """Whether a noted finding of the same kind about the same subject covers it."""
        self._noted = [i for i in self._noted if now - i.last_step <= self.policy.clear_steps]
        return any(
            i.finding.kind == finding.kind
            and (
                covers(i.finding.subject, finding.subject)
                or covers(finding.subject, i.finding.subject)
            )
            for i in self._noted
        )

    def _absorb(self, inc: Incident, finding: Finding, now: float) -> bool:
        """Merges into an open incident; False when the finding escalates a released one or
        names its cause."""
        inc.last_step = now
        if not inc.released:
            inc.finding = merge(inc.finding, finding)
            return True
        escalates = finding.severity == Severity.CRITICAL != inc.finding.severity
        names_its_cause = finding.kind in EXPLAINED_BY.get(inc.finding.kind, ())
        return not (escalates or names_its_cause)

    def _explained(self, symptom: Finding, now: float) -> bool:
        """Whether a specific fault began about when the symptom's shift began."""
        began = now - symptom.evidence.get("steps_shifted", 0.0) - self.policy.symptom_window
        return self._explained_by(
            symptom,
            lambda inc: (
                inc.finding.kind not in SYMPTOMS
                and (began <= inc.opened_at <= now or self._may_still_be_on(inc, now))
            ),
        )

    def _on_a_fault_still_on(self, generic: Finding, now: float) -> bool:
        """Whether a fail-slow incident on the generic finding's subject (or one covering
        it) may still be on (``_may_still_be_on``: a stalled rank's GPU idles for as long as
        its data loader stalls, after the stall's incident closed). One metric off on that
        subject is its effect."""
        return self._explained_by(
            generic,
            lambda inc: (
                inc.finding.kind not in GENERIC
                and inc.finding.kind not in SYMPTOMS
                and self._may_still_be_on(inc, now)
                and inc.opened_at <= now
                and covers(inc.finding.subject, generic.subject)
            ),
        )

    def _found_by_another(self, finding: Finding, now: float) -> bool:
        """Whether another detector released this fail-slow finding (its kind, its subject)
        while the fault may still be on: two detectors' bars (a live run's coarse and
        precise peer comparisons) are crossed at different steps of one fault. A detector's
        own hysteresis says when its fault cleared; another's does not."""
        return finding.severity == Severity.WARN and any(
            inc.released
            and inc.finding.kind == finding.kind
            and inc.finding.subject == finding.subject
            and inc.finding.detector != finding.detector
            and self._may_still_be_on(inc, now)
            for inc in [*self.incidents, *self._history]
        )

    def _may_still_be_on(self, inc: Incident, now: float) -> bool:
        """A fail-slow (WARN) incident opened within ``ongoing_window``: such faults last
        minutes to tens of minutes, and the incident may have closed while it stays on."""
        return (
            inc.finding.severity == Severity.WARN
            and inc.opened_at >= now - self.policy.ongoing_window
        )

    def _explained_by(self, effect: Finding, is_cause: Callable[[Incident], bool]) -> bool:
        """Whether an incident, open or closed, is the cause of ``effect``; a held one takes
        it into its finding."""
        for inc in [*self.incidents, *self._history]:
            if is_cause(inc):
                if not inc.released:
                    inc.finding = merge(inc.finding, effect)
                return True
        return False

    def _absorb_held_symptoms(self, finding: Finding) -> Finding:
        """Symptoms still waiting for a cause take this finding as theirs."""
        held = [i for i in self.incidents if i.finding.kind in SYMPTOMS and not i.released]
        for inc in held:
            self.incidents.remove(inc)
            finding = merge(finding, inc.finding)
        return finding

    def _flapping(self, subject: Subject, now: float) -> bool:
        opened = self._opened.setdefault(subject, deque())
        while opened and now - opened[0] > self.policy.flap_window:
            opened.popleft()
        opened.append(now)
        return len(opened) > self.policy.flap_max

    def _expire(self, now: float) -> None:
        keep = []
        for inc in self.incidents:
            if inc.released and now - inc.last_step > self.policy.clear_steps:
                self._history.append(inc)
            else:
                keep.append(inc)
        self.incidents = keep

    def _release_critical(self) -> list[Finding]:
        return self._release(lambda inc: inc.finding.severity == Severity.CRITICAL)

    def tick(self, now: float) -> list[Finding]:
        """Releases the held findings whose hold has passed at position ``now``."""
        self._expire(now)
        return self._release(lambda inc: now - when(inc.finding) >= self._hold(inc.finding))

    def _hold(self, finding: Finding) -> float:
        # A symptom, or a generic finding (one metric off, a learned score), waits longer:
        # the specific fault that explains it may be slower to show.
        if finding.kind in SYMPTOMS or finding.kind in GENERIC:
            return max(self.policy.hold_steps, self.policy.symptom_window)
        return self.policy.hold_steps

    def release_all(self) -> list[Finding]:
        return self._release(lambda inc: True)

    def _release(self, due: Callable[[Incident], bool]) -> list[Finding]:
        out = [inc for inc in self.incidents if not inc.released and due(inc)]
        for inc in out:
            inc.released = True
        return ordered(self._fan_in([inc.finding for inc in out]))

    def _fan_in(self, findings: list[Finding]) -> list[Finding]:
        """A job-wide kind (a loss spike) seen on several ranks at once is one job finding."""
        result: list[Finding] = []
        by_kind: dict[str, list[Finding]] = {}
        for f in findings:
            if f.kind in JOB_WIDE and f.subject.scope != "job":
                by_kind.setdefault(f.kind, []).append(f)
            else:
                result.append(f)
        for group in by_kind.values():
            if len(group) < 2:
                result.extend(group)
                continue
            merged = reduce(merge, group)
            merged = replace(
                merged,
                subject=JOB,
                evidence={**merged.evidence, "ranks_affected": float(len(group))},
            )
            self.incidents.append(Incident(merged, when(merged), True, when(merged)))
            result.append(merged)
        return result


class DetectorPipeline:
    """Runs a list of Detectors over frames or whole steps and fuses what they find.

    Frames and steps pass the ``Edge`` first (detectors.edge): they may name metrics by any
    alias of collector.vocabulary, and derived features (``compute_ms``, counter rates,
    ``since_launch``) are added, so every detector reads canonical names and units.

    It never raises into its caller: a detector that raises is logged once per error type
    and counted in ``errors``, and the others carry on. Detectors with ``process_step``
    take whole steps; the others get one Frame per rank (rules that declare ``FEATURES``
    get only the ranks that report one of them, which keeps large steps cheap).

    Args:
        detectors: the detectors to run.
        policy: fusion parameters.
        release_after_s: in ``poll``, findings held this long with no new step are released.
    """

    name = "pipeline"

    def __init__(
        self,
        detectors: Sequence[Detector],
        policy: FusionPolicy | None = None,
        release_after_s: float = 30.0,
    ) -> None:
        self.detectors = list(detectors)
        self.edge = Edge()
        self.fuser = Fuser(policy)
        self.release_after_s = release_after_s
        self.errors: dict[str, int] = {}
        self.raw_count = 0
        self._last_time: float | None = None
        self._stepped = False
        self._logged: set[tuple[str, str]] = set()

    def process(self, frame: Frame) -> list[Finding]:
        frame = self.edge.frame(frame)
        raw: list[Finding] = []
        for det in self.detectors:
            raw += self._call(det, det.process, frame)
        self._last_time = frame.time
        return self._fuse(raw, self._position(frame))

    def _position(self, frame: Frame) -> float | None:
        """The fusion clock: steps once any frame had one (a step-less lifecycle frame in a
        stepped stream then moves nothing), else time."""
        if frame.step is not None:
            self._stepped = True
            return float(frame.step)
        return None if self._stepped else frame.time

    def note(self, finding: Finding) -> None:
        """A finding raised outside the pipeline; see ``Fuser.note``."""
        self.fuser.note(finding)

    def process_step(self, batch: StepBatch) -> list[Finding]:
        """Runs every detector over one step of all ranks."""
        batch = self.edge.batch(batch)
        raw: list[Finding] = []
        for det in self.detectors:
            step_fn = getattr(det, "process_step", None)
            if step_fn is not None:
                raw += self._call(det, step_fn, batch)
            else:
                for frame in _frames_for(det, batch):
                    raw += self._call(det, det.process, frame)
        self._last_time = batch.time
        return self._fuse(raw, float(batch.step))

    def poll(self, now: float) -> list[Finding]:
        raw: list[Finding] = []
        for det in self.detectors:
            raw += self._call(det, det.poll, now)
        out = self._fuse(raw, None)
        if self._last_time is not None and now - self._last_time >= self.release_after_s:
            out += self.fuser.release_all()
        return out

    def flush(self) -> list[Finding]:
        """End of stream: evaluates what detectors still buffer and releases every finding."""
        raw: list[Finding] = []
        for det in self.detectors:
            flush = getattr(det, "flush", None)
            if flush is not None:
                raw += self._call(det, flush)
        return self._fuse(raw, None) + self.fuser.release_all()

    def _fuse(self, raw: Iterable[Finding], position: float | None) -> list[Finding]:
        out: list[Finding] = []
        for finding in ordered(list(raw)):
            self.raw_count += 1
            out += self.fuser.add(finding)
        if position is not None:
            out += self.fuser.tick(position)
        return out

    def _call(
        self, det: Detector, fn: Callable[..., Iterable[Finding]], *args: Any
    ) -> list[Finding]:
        try:
            return list(fn(*args))
        except Exception as exc:  # the hot path must not raise into the training loop
            name = getattr(det, "name", type(det).__name__)
            self.errors[name] = self.errors.get(name, 0) + 1
            if (name, type(exc).__name__) not in self._logged:
                self._logged.add((name, type(exc).__name__))
                log.warning(
                    "detector %s failed (%r); further such errors are counted only", name, exc
                )
            return []


def _frames_for(det: Detector, batch: StepBatch) -> Iterable[Frame]:
    features = getattr(det, "FEATURES", None)
    if features is None:
        return batch.frames()
    rows = np.zeros(len(batch.ranks), dtype=bool)
    for feature in features:
        rows |= batch.reported(feature)
    if not rows.any():
        return ()
    sub = StepBatch(
        batch.step,
        batch.time,
        batch.ranks[rows],
        batch.nodes[rows],
        batch.replicas[rows],
        batch.features,
        batch.values[rows],
        None if batch.present is None else batch.present[rows],
    )
    return sub.frames()
