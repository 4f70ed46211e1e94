"""The watch loop: telemetry and lifecycle in, findings and actions out, all recorded.

One thread drives it, ``tick_s`` at a time (sooner when telemetry arrives, or when the
supervisor has something to judge now): drain telemetry (stored, turned into frames),
poll the supervisor (exits, launches), look at the rank processes (/proc), run the
detectors, hand findings to remediation, which acts through the runtime, and record every
finding, decision and event. No stage waits on a rank: an action that takes longer than a
tick (a command every replica answers) is recorded as pending, and its final outcome is
recorded, for the same finding, in the tick that sees it end. A hang's finding is stored
with every rank's stacks, captured before remediation acts on it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collector.aggregate import StepAggregator
from collector.transport import TelemetryReceiver
from collector.types import JOB, Frame, Sample
from detectors.base import Detector
from detectors.progress import NO_STEP_NOTICE_S, PROC_FEATURES, ProgressStall
from detectors.types import Finding
from eagleeye.detection import fenced_hang
from eagleeye.errors import StoreError
from eagleeye.failures import CrashLoop, RankFailure, rank_error
from eagleeye.hostsources import host_frames
from eagleeye.ingest import LaunchedAttempts, ingest_samples, lifecycle_frames
from eagleeye.injector import OutsideInjector
from eagleeye.procwatch import ProcessWatch
from eagleeye.resume import KnownCheckpoints
from eagleeye.stacks import HangStacks, StackCapture
from eagleeye.stopping import (
    EVENT_LISTENING,
    pace_known,
    request_checkpoint,
    request_step,
    typical_step_s,
)
from eagleeye.store import RunStore
from ft_runtime.base import Supervisor
from ft_runtime.types import LifecycleEvent, Phase
from remediation.remediator import Decision, Remediator

log = logging.getLogger(__name__)

# What ranks report besides steps: a collective left open, a pause, a session closing, and
# what the controller adds: a look at the process, a restart of the whole job.
MARKERS = frozenset({"in_collective", "closing", "pause", "job_restart"}) | PROC_FEATURES
COMMIT_WAIT_S = 2.0  # how long a finding or action waits to be committed before it is shown
LOOK_S = 0.01
"""While it waits for telemetry, the loop asks the supervisor this often whether something
is to be judged now (``look_now``: a stopped rank the others wait for)."""


@dataclass(frozen=True, slots=True)
class UnknownProgress:
    """Ranks that have sent no step ``after_s`` seconds into an attempt: their progress is
    unknown, and they are not judged hung for it (only /proc can show them hung)."""

    ranks: tuple[int, ...]
    attempt: int
    after_s: float


@dataclass(frozen=True, slots=True)
class StopRequest:
    """A stop asked of the job from outside (a signal), with its grace period."""

    cause: str
    signal: int
    grace_s: float


@dataclass
class ControllerReport:
    succeeded: bool = False
    stopped: StopRequest | None = None
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
    unknown_after_s: when, into an attempt, ranks without a step are announced
        (`eagleeye run --no-step-notice`).
    injector: fires the job's kill, stop and slow faults from outside the ranks.
    run_dir: the run folder (the checkpoint request of a graceful stop goes there).
    inbox: findings from outside (Alertmanager's webhook), taken every tick and answered
        like the detectors' own.
    host: the host's sources (``eagleeye.hostsources``): their samples, taken every tick,
        are stored, exported (``on_samples``) and read by ``host_detectors``.
    host_detectors: the rules on the host's samples (XIDs, ECC errors, thermal throttles).
    """

    def __init__(
        self,
        supervisor: Supervisor,
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
        unknown_after_s: float = NO_STEP_NOTICE_S,
        injector: OutsideInjector | None = None,
        run_dir: Path | None = None,
        inbox: Callable[[], list[Finding]] | None = None,
        host: Callable[[], list[Sample]] | None = None,
        host_detectors: Sequence[Detector] = (),
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
        self._step_times: deque[float] = deque(maxlen=64)  # the newest, of any rank
        self.aggregator = StepAggregator()
        self.launched = LaunchedAttempts()
        self.procs = ProcessWatch()
        self.stacks = stacks
        self.progress = progress
        self.unknown_after_s = unknown_after_s
        self.inbox = inbox
        self.host = host
        self.host_detectors = list(host_detectors)
        self._progress_seen: dict[str, str] = {}
        self._progress_at = 0.0
        self._attempt_started = (0, 0.0)  # attempt, when; the unknown ranks announced once
        self.injector = injector
        self.run_dir = run_dir
        self.checkpoints = KnownCheckpoints()
        self.crash_loop = CrashLoop()
        self._stop: StopRequest | None = None
        self._listening: set[int] = set()  # ranks whose loop checkpoints when asked
        self._tick_errors: dict[str, int] = {}
        self._rejected = 0
        self._under_way: dict[str, int | None] = {}  # action key -> its finding's id

    def request_stop(self, request: StopRequest) -> None:
        """Asks the loop to stop the job (safe from a signal handler); a second request
        while the first is pending shortens the grace period to nothing."""
        if self._stop is not None:
            request = StopRequest(request.cause, request.signal, 0.0)
        self._stop = request

    def run(self) -> ControllerReport:
        self.report.started = self.clock()
        self.supervisor.start()
        try:
            while not self.supervisor.finished and self._stop is None:
                self.tick()
            if self._stop is not None and not self.supervisor.finished:
                self._stop_job(self._stop)
            self._finish_actions()  # commands the job's end cut short: their final outcomes
            self._drain_telemetry(grace_s=0.5)
            self._flush_detectors()
        finally:
            if self.injector is not None:
                self.injector.close()
            self.supervisor.stop_all()
            self.report.ended = self.clock()
            self.report.succeeded = self.supervisor.phase is Phase.SUCCEEDED
        return self.report

    def _stop_job(self, request: StopRequest) -> None:
        """Ends every rank on a stop request, after the checkpoint it asks for; recorded."""
        self.report.stopped = request
        if request.grace_s > 0 and self._listening and self.run_dir is not None:
            self._await_checkpoints(request, self.clock() + request.grace_s / 2)
        self.supervisor.stop(f"stopped by {request.cause}", request.grace_s)
        self._lifecycle(self.supervisor.poll())

    def _await_checkpoints(self, request: StopRequest, deadline: float) -> None:
        """Asks the listening loops for a checkpoint and waits until each has saved one;
        when every rank listens, until they have left their loops and ended, as a loop that
        saves on request does (the signal then finds nothing to stop)."""
        assert self.run_dir is not None
        self._await_pace(self.clock() + request.grace_s / 4)
        asked = self.clock()
        newest = max(self._last_step.values(), default=None)
        step = request_step(newest, typical_step_s(self._step_times))
        request_checkpoint(self.run_dir, request.cause, step)
        saved: set[int] = set()
        everyone_listens = self._listening >= set(self.supervisor.pids())
        while self.clock() < deadline and self.supervisor.alive() > 0:
            if self._listening <= saved and not everyone_listens:
                break  # the others are stopped by the signal; the listeners saved
            saved |= _ranks_sending(self._take_telemetry(), "event.checkpoint", since=asked)

    def _await_pace(self, until: float) -> None:
        """A stop that came before a few step times were known waits for them (until
        ``until`` at most): a lead counted in the first step's time (warm-up, ten times a
        steady step) is passed before the request reaches the ranks, and each then saves
        at a step of its own, waiting on the others' collectives to the end."""
        while (
            not pace_known(self._step_times)
            and self.clock() < until
            and self.supervisor.alive() > 0
        ):
            self._take_telemetry()

    def _take_telemetry(self) -> list[Sample]:
        """One tick of a stop's waits: the ranks' samples stored and their steps noted,
        the supervisor's lifecycle events recorded; the samples."""
        samples = self.receiver.receive(timeout_s=self.tick_s)
        self._note_steps(ingest_samples(self.store, samples, self.launched.current))
        self._lifecycle(self.supervisor.poll())
        return samples

    def tick(self) -> None:
        """One pass of the loop. An exception in any stage is recorded as an event (once
        per kind of failure, then counted) and the loop goes on."""
        try:
            self._tick()
        except Exception as exc:
            self._tick_failed(exc)

    def _tick_failed(self, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"[:500]
        if error not in self._tick_errors and len(self._tick_errors) >= 256:
            error = type(exc).__name__  # bounded: new kinds are counted by type alone
        time.sleep(self.tick_s)  # a stage that fails at once must not spin the loop
        count = self._tick_errors.get(error, 0) + 1
        self._tick_errors[error] = count
        if count & (count - 1):  # recorded the 1st, 2nd, 4th, 8th... time
            return
        log.error("a controller stage failed (%d times); the loop goes on", count, exc_info=exc)
        try:
            attempt = self.supervisor.attempt
            detail = {"error": error, "count": count}
            self.store.add_event(
                LifecycleEvent("controller", Phase.RUNNING, self.clock(), attempt, detail)
            )
        except Exception:
            log.exception("could not record a controller failure")

    def _receive(self) -> list[Sample]:
        """Telemetry that arrives within ``tick_s`` (the wait ends with the first of it), or
        none, sooner, when the supervisor has something to judge now."""
        deadline = time.monotonic() + self.tick_s
        while True:
            left = deadline - time.monotonic()
            samples = self.receiver.receive(timeout_s=max(0.0, min(LOOK_S, left)))
            if samples or left <= LOOK_S or self.supervisor.look_now():
                return samples

    def _tick(self) -> None:
        samples = self._receive()
        if self.receiver.malformed != self._rejected:  # dropped telemetry, counted by reason
            self._rejected = self.receiver.malformed
            self.store.set_meta("telemetry_rejected", dict(self.receiver.rejected))
        frames = ingest_samples(self.store, samples, self.launched.current)
        if samples:
            self.on_samples(samples)
            self._observe(samples, frames)
        if self.injector is not None:
            self.injector.poll(self.clock())
        frames += self._lifecycle(self.supervisor.poll())
        self._finish_actions()
        frames += self._aggregate(frames)
        looks = self._unheld(self.procs.frames(self.clock()))
        frames += looks
        self.store.add_samples(self.procs.stopped_samples(looks, self._step_in))
        self._report_progress()
        for finding in self._detect(frames, poll=True):
            self._answer(finding)
        for finding in self.inbox() if self.inbox is not None else ():
            self._answer(finding)
        for finding in self._host_findings():
            self._answer(finding)
        # A restart launched ranks just now, or the job failed: detectors must know at once.
        # (Exits that came in meanwhile wait for the next tick: the job must not fail on
        # an exit that no detector, and so no remediation, has seen yet.)
        later = self._lifecycle(self.supervisor.settle())
        for finding in self._detect(later, poll=False):
            self._answer(finding)

    def _host_findings(self) -> list[Finding]:
        """The host's samples since the last tick: stored, exported, and read by the host
        rules; a finding on a rank names the step it is in."""
        samples = self.host() if self.host is not None else []
        if not samples:
            return []
        self.store.add_samples(samples)
        self.on_samples(samples)
        frames = [
            replace(f, step=self._step_in(f.subject.rank)) if f.subject.rank is not None else f
            for f in host_frames(samples)
        ]
        return self._detect(frames, poll=False, detectors=self.host_detectors)

    def _unheld(self, looks: list[Frame]) -> list[Frame]:
        """A rank held back by an injected slow fault is slow, not stopped."""
        held = self.injector.held() if self.injector is not None else frozenset()
        return [
            replace(f, values={**f.values, "proc_stopped": 0.0})
            if f.subject.rank in held and "proc_stopped" in f.values
            else f
            for f in looks
        ]

    def _observe(self, samples: list[Sample], frames: list[Frame]) -> None:
        """What the controller itself takes from telemetry: checkpoints to resume from,
        loops that checkpoint on request, the steps at which faults fire."""
        self.checkpoints.observe(samples)
        self._listening |= _ranks_sending(samples, EVENT_LISTENING)
        if self.injector is not None:
            self.injector.observe(samples, frames)

    def _aggregate(self, frames: list[Frame]) -> list[Frame]:
        """Node and replica frames: complete ones, and those whose wait ran out."""
        groups: list[Frame] = []
        for frame in frames:
            if "launched" in frame.values:
                self.aggregator.expect(frame.subject)
            elif not frame.values.keys() <= MARKERS:  # a wait or close report is no step
                groups += self.aggregator.add(frame)
        return groups + self.aggregator.flush(self.clock())

    def _note_steps(self, frames: list[Frame]) -> None:
        """Each rank's newest step and the recent step times (a stop's step is named in
        them)."""
        for frame in frames:
            if frame.step is not None and frame.subject.rank is not None:
                self._last_step[frame.subject.rank] = frame.step
                if "step_time" in frame.values:
                    self._step_times.append(frame.values["step_time"])

    def _detect(
        self, frames: list[Frame], poll: bool, detectors: Sequence[Detector] | None = None
    ) -> list[Finding]:
        if detectors is None:
            detectors = self.detectors
            self._note_steps(frames)
        findings: list[Finding] = []
        for detector in detectors:
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
        self._committed()
        self.on_update(finding)
        if finding.kind == "hang" and self.stacks is not None:
            self._capture_stacks(finding, finding_id, self.stacks)
        for decision in self.remediator.handle(finding):
            if not decision.outcome.final:
                self._under_way[decision.action.key] = finding_id
            self._record_decision(decision, finding_id)

    def _record_decision(self, decision: Decision, finding_id: int | None) -> None:
        self.store.add_outcome(decision.outcome, finding_id, decision.dry_run, decision.decided_at)
        self.report.decisions.append(decision)
        self._committed()
        self.on_update(decision)

    def _finish_actions(self) -> None:
        """Actions that were under way and ended: their final outcomes, recorded for the
        finding that caused them (a second row of the same action)."""
        for outcome in self.supervisor.outcomes():
            finding_id = self._under_way.pop(outcome.action.key, None)
            decision = self.remediator.complete(outcome)
            if decision is not None:
                self._record_decision(decision, finding_id)

    def _committed(self) -> None:
        """Waits (briefly) until the rows given so far are committed: a finding or action is
        in the store before it is shown, so a controller killed right after its console
        line leaves none the store lacks. A store that cannot commit now is logged, and the
        finding is still answered (its rows stay queued for the writer's retry)."""
        try:
            self.store.flush(timeout_s=COMMIT_WAIT_S)
        except StoreError as exc:
            log.warning("shown before it was committed: %s", exc)

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
                self._listening.clear()
                if self.injector is not None:
                    self.injector.new_attempt(event.attempt, event.time)
        for event in events:
            self.store.add_event(event)
            self.report.events.append(event)
            self.on_update(event)
            if _first_failure(event):
                self._failed(event)
            elif _fenced_for_a_stall(event):
                self._fencing_cause(event)
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

    def _fencing_cause(self, event: LifecycleEvent) -> None:
        """A replica the quorum dropped as hung: its cause (the hang, on the late ranks, with
        the wait, the limit and the ranks found stopped as evidence) is the finding, the
        fencing kill its action; the killed ranks' exits that follow are its consequence."""
        finding, outcome = fenced_hang(event, self._last_step)
        finding_id = self.store.add_finding(finding)
        self.report.findings.append(finding)
        self._committed()
        self.on_update(finding)
        self.store.add_outcome(outcome, finding_id, dry_run=False, decided_at=event.time)

    def _failed(self, event: LifecycleEvent) -> None:
        """A rank failed first in its attempt: show what it said; stop a crash loop."""
        if not self.crash_loop.first_of_attempt(event.attempt):
            return
        rank = int(event.subject.removeprefix("rank:"))
        log_path = self.supervisor.log_path(rank)
        failure = RankFailure(
            rank,
            event.attempt,
            int(event.detail["exit_code"]),
            self._last_step.get(rank),
            "" if log_path is None else rank_error(log_path.parent, rank),
            "" if log_path is None else str(log_path),
        )
        self.on_update(failure)
        loop = self.crash_loop.note(failure)
        if loop is not None:
            self.supervisor.stop_restarting(loop)

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


def _ranks_sending(samples: list[Sample], name: str, since: float = -math.inf) -> set[int]:
    """The ranks that sent a sample ``name`` at ``since`` or later."""
    return {
        int(s.labels["rank"])
        for s in samples
        if s.name == name and s.time >= since and s.labels.get("rank", "").isdigit()
    }


def _fenced_for_a_stall(event: LifecycleEvent) -> bool:
    return (
        event.phase is Phase.EXITED
        and event.subject.startswith("replica:")
        and str(event.detail.get("reason", "")).startswith("hung")
    )


def _first_failure(event: LifecycleEvent) -> bool:
    """A rank's exit with an error that is not the collateral of another's."""
    return (
        event.phase is Phase.EXITED
        and event.subject.startswith("rank:")
        and event.detail.get("exit_code") not in (0, None)
        and not event.detail.get("collateral")
    )


def _safely(name: str, call: Callable[[Any], Sequence[Finding]], arg: Any) -> Sequence[Finding]:
    """A detector that raises loses its findings for this frame, never the controller."""
    try:
        return call(arg)
    except Exception:
        log.exception("detector %s raised; its findings for this frame are lost", name)
        return ()
