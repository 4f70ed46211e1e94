"""The watch loop: telemetry and lifecycle in, findings and actions out, all recorded.

One thread drives it, ``tick_s`` at a time: drain telemetry (stored, turned into frames),
poll the supervisor (exits, launches), look at the rank processes (/proc), run the
detectors, hand findings to remediation, which acts through the runtime, and record every
finding, decision and event. A hang's finding is stored with every rank's stacks, captured
before remediation acts on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from collector.aggregate import StepAggregator
from collector.transport import TelemetryReceiver
from collector.types import JOB, Frame, Sample
from detectors.base import Detector
from detectors.progress import PROC_FEATURES, ProgressStall
from detectors.types import Finding
from eagleeye.ingest import LaunchedAttempts, ingest_samples, lifecycle_frames
from eagleeye.procwatch import ProcessWatch
from eagleeye.stacks import HangStacks, StackCapture
from eagleeye.store import RunStore
from ft_runtime.supervisor import JobSupervisor
from ft_runtime.types import LifecycleEvent, Phase
from remediation.remediator import Decision, Remediator

log = logging.getLogger(__name__)

# What ranks report besides steps: a collective left open, a pause, a session closing, and
# what the controller adds: a look at the process, a restart of the whole job.
MARKERS = frozenset({"in_collective", "closing", "pause", "job_restart"}) | PROC_FEATURES


@dataclass(frozen=True, slots=True)
class UnknownProgress:
    """Ranks that have sent no step ``after_s`` seconds into an attempt: their progress is
    unknown, and they are not judged hung for it (only /proc can show them hung)."""

    ranks: tuple[int, ...]
    attempt: int
    after_s: float


@dataclass
class ControllerReport:
    succeeded: bool = False
    findings: list[Finding] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    events: list[LifecycleEvent] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0


class Controller:
    """Args:
    supervisor: owns the rank processes.
    receiver: telemetry from the ranks.
    store: where everything is recorded.
    detectors: run on every frame and polled every tick.
    remediator: decides and executes actions.
    on_update: called with each finding, decision and event, for live output.
    stacks: captures every rank's stacks when a hang is found (None: not captured).
    progress: the progress detector, whose view of each rank is kept in the store's meta
        (``progress``: rank → stepping, waiting, paused, stopped, blocked, closing or
        unknown) and whose ranks of unknown progress are announced once per attempt.
    unknown_after_s: when, into an attempt, ranks without a step are announced.
    inbox: findings from outside (Alertmanager's webhook), taken every tick and answered
        like the detectors' own.
    """

    def __init__(
        self,
        supervisor: JobSupervisor,
        receiver: TelemetryReceiver,
        store: RunStore,
        detectors: Sequence[Detector],
        remediator: Remediator,
        on_update: Callable[[object], None] = lambda item: None,
        on_samples: Callable[[list[Sample]], None] = lambda samples: None,
        tick_s: float = 0.05,
        clock: Callable[[], float] = time.time,
        stacks: StackCapture | None = None,
        progress: ProgressStall | None = None,
        unknown_after_s: float = 60.0,
        inbox: Callable[[], list[Finding]] | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.receiver = receiver
        self.store = store
        self.detectors = list(detectors)
        self.remediator = remediator
        self.on_update = on_update
        self.on_samples = on_samples
        self.tick_s = tick_s
        self.clock = clock
        self.report = ControllerReport()
        self._last_step: dict[int, int] = {}
        self.aggregator = StepAggregator()
        self.launched = LaunchedAttempts()
        self.procs = ProcessWatch()
        self.stacks = stacks
        self.progress = progress
        self.unknown_after_s = unknown_after_s
        self.inbox = inbox
        self._progress_seen: dict[str, str] = {}
        self._progress_at = 0.0
        self._attempt_started = (0, 0.0)  # attempt, when; the unknown ranks announced once

    def run(self) -> ControllerReport:
        self.report.started = self.clock()
        self.supervisor.start()
        try:
            while not self.supervisor.finished:
                self.tick()
            self._drain_telemetry(grace_s=0.5)
            self._flush_detectors()
        finally:
            self.supervisor.stop_all()
            self.report.ended = self.clock()
            self.report.succeeded = self.supervisor.phase is Phase.SUCCEEDED
        return self.report

    def tick(self) -> None:
        samples = self.receiver.receive(timeout_s=self.tick_s)
        frames = ingest_samples(self.store, samples, self.launched.current)
        if samples:
            self.on_samples(samples)
        frames += self._lifecycle(self.supervisor.poll())
        frames += self._aggregate(frames)
        looks = self.procs.frames(self.clock())
        frames += looks
        self.store.add_samples(self.procs.stopped_samples(looks, self._step_in))
        self._report_progress()
        for finding in self._detect(frames, poll=True):
            self._answer(finding)
        for finding in self.inbox() if self.inbox is not None else ():
            self._answer(finding)
        # A restart launched ranks just now, or the job failed: detectors must know at once.
        later = self._lifecycle(self.supervisor.poll() + self.supervisor.settle())
        for finding in self._detect(later, poll=False):
            self._answer(finding)

    def _aggregate(self, frames: list[Frame]) -> list[Frame]:
        """Node and replica frames: complete ones, and those whose wait ran out."""
        groups: list[Frame] = []
        for frame in frames:
            if "launched" in frame.values:
                self.aggregator.expect(frame.subject)
            elif not frame.values.keys() <= MARKERS:  # a wait or close report is no step
                groups += self.aggregator.add(frame)
        return groups + self.aggregator.flush(self.clock())

    def _detect(self, frames: list[Frame], poll: bool) -> list[Finding]:
        for frame in frames:
            if frame.step is not None and frame.subject.rank is not None:
                self._last_step[frame.subject.rank] = frame.step
        findings: list[Finding] = []
        for detector in self.detectors:
            found: list[Finding] = []
            for frame in frames:
                found.extend(_safely(detector.name, detector.process, frame))
            if poll:
                found.extend(_safely(detector.name, detector.poll, self.clock()))
            self._share(detector, found)
            findings.extend(found)
        return findings

    def _share(self, source: Detector, found: list[Finding]) -> None:
        """Detectors that take note of others' findings (fusion) see them."""
        for detector in self.detectors:
            note = getattr(detector, "note", None)
            if note is not None and detector is not source:
                try:
                    for finding in found:
                        note(finding)
                except Exception:
                    log.exception("detector %s failed to take note of a finding", detector.name)

    def _flush_detectors(self) -> None:
        """End of the run: findings that detectors still hold (fusion's hold) come out."""
        for detector in self.detectors:
            flush = getattr(detector, "flush", None)
            if flush is not None:
                for finding in _safely(detector.name, lambda call: call(), flush):
                    self._answer(finding)

    def _answer(self, finding: Finding) -> None:
        finding_id = self.store.add_finding(finding)
        self.report.findings.append(finding)
        self.on_update(finding)
        if finding.kind == "hang" and self.stacks is not None:
            self._capture_stacks(finding, finding_id, self.stacks)
        for decision in self.remediator.handle(finding):
            self.store.add_outcome(
                decision.outcome, finding_id, decision.dry_run, decision.decided_at
            )
            self.report.decisions.append(decision)
            self.on_update(decision)

    def _step_in(self, rank: int) -> int | None:
        """The step a rank is in: the one after the last it reported."""
        last = self._last_step.get(rank)
        return None if last is None else last + 1

    def _report_progress(self) -> None:
        """Each second: every rank's progress into the store's meta when it changed, and
        once per attempt the ranks whose progress is still unknown."""
        now = self.clock()
        if self.progress is None or now - self._progress_at < 1.0:
            return
        self._progress_at = now
        states = {s.rank: v for s, v in self.progress.progress(now).items() if s.rank is not None}
        named = {str(rank): state for rank, state in sorted(states.items())}
        if named != self._progress_seen:
            self._progress_seen = named
            self.store.set_meta("progress", named)
        attempt, started = self._attempt_started
        unknown = tuple(rank for rank, state in sorted(states.items()) if state == "unknown")
        if started and now - started >= self.unknown_after_s and unknown:
            self._attempt_started = (attempt, 0.0)
            self.on_update(UnknownProgress(unknown, attempt, self.unknown_after_s))

    def _capture_stacks(self, finding: Finding, finding_id: int, capture: StackCapture) -> None:
        """Every live rank's stacks, stored with the finding, before anything acts on it."""
        stacks = capture.capture(self.procs.pids())
        now = self.clock()
        for stack in stacks:
            self.store.add_stack(
                now,
                finding_id,
                stack.rank,
                attempt=self.supervisor.attempt,
                pid=stack.pid,
                method=stack.method,
                state=stack.state,
                text=stack.text,
            )
        self.on_update(HangStacks(finding, stacks))

    def _lifecycle(self, events: list[LifecycleEvent]) -> list[Frame]:
        self.launched.note(events)
        self.procs.note(events)
        for event in events:
            if event.subject == "job" and event.phase is Phase.LAUNCH:
                self._attempt_started = (event.attempt, event.time)
        for event in events:
            self.store.add_event(event)
            self.report.events.append(event)
            self.on_update(event)
        frames = lifecycle_frames(events)
        # A new attempt of the whole job is a new baseline for the detectors.
        frames += [
            Frame(JOB, None, e.time, {"job_restart": float(e.attempt)})
            for e in events
            if e.subject == "job" and e.phase is Phase.RECOVERING
        ]
        # An exit belongs to the last step the rank reported, so findings name it.
        return [
            replace(f, step=self._last_step.get(f.subject.rank))
            if f.step is None and f.subject.rank is not None
            else f
            for f in frames
        ]

    def _drain_telemetry(self, grace_s: float) -> None:
        deadline = self.clock() + grace_s
        while self.clock() < deadline:
            samples = self.receiver.receive(timeout_s=0.1)
            if not samples:
                break
            frames = ingest_samples(self.store, samples, self.launched.current)
            self.on_samples(samples)  # the exporter's final state counts the last steps too
            for finding in self._detect(frames + self._aggregate(frames), poll=False):
                self._answer(finding)


def _safely(name: str, call: Callable[[Any], Sequence[Finding]], arg: Any) -> Sequence[Finding]:
    """A detector that raises loses its findings for this frame, never the controller."""
    try:
        return call(arg)
    except Exception:
        log.exception("detector %s raised; its findings for this frame are lost", name)
        return ()
