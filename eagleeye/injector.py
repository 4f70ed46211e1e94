"""Faults fired from outside the ranks, so that `--inject` works on any script.

Kill, stop and slow need no code in the rank: the supervisor sends SIGKILL or SIGSTOP, or
slows the rank by a SIGSTOP/SIGCONT duty cycle (held ``seconds`` at each step it reports;
the controller does not take those holds for a stopped rank), when the rank's telemetry
(zero-code or the hook) reports the fault's step, or when the attempt has run for the
fault's time. A loop that fires its own faults (``ee.faults.fire(step)``) says so once,
before its first step, and its step faults are then left to it, so nothing fires twice.
Faults that never fired are reported at the end of the run.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from collector.types import Frame, Sample
from ft_runtime.faults import EVENT_INJECTOR_ARMED, FaultSpec

log = logging.getLogger(__name__)

SLOW_PERIOD_S = 1.0
"""A slow fault at a time on a rank with no step telemetry: held ``seconds`` per period."""


@dataclass(frozen=True, slots=True)
class FaultFired:
    """A fault the supervisor fired (for the console and the store)."""

    spec: FaultSpec
    step: int | None
    time: float
    attempt: int


class OutsideInjector:
    """Fires the job's kill, stop and slow faults from outside the rank processes.

    Args:
        specs: every fault of the job; those the supervisor cannot fire are only watched
            (the rank fires them and reports them), so that unfired ones can be named.
        pids: the live rank processes, rank id → pid.
        record: called with each fault the supervisor fired.
        send: delivers a signal to a pid (``os.kill``; a test may record instead).
    """

    def __init__(
        self,
        specs: Sequence[FaultSpec],
        pids: Callable[[], dict[int, int]],
        record: Callable[[FaultFired], None],
        send: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.specs = list(specs)
        self.pids = pids
        self.record = record
        self.send = send
        self.fired: set[str] = set()
        self._armed: set[int] = set()  # ranks whose loop fires its own faults this attempt
        self._attempt = -1
        self._started = 0.0
        self._steps: dict[int, int] = {}
        self._slowed: dict[str, int] = {}  # slow fault → steps or periods slowed so far
        self._next_period: dict[str, float] = {}
        self._holds: list[threading.Thread] = []
        self._held_ranks: dict[int, int] = {}
        self._closing = threading.Event()
        self._lock = threading.Lock()

    def new_attempt(self, attempt: int, started: float) -> None:
        self._attempt, self._started = attempt, started
        self._armed.clear()
        self._steps.clear()

    def observe(self, samples: Iterable[Sample], frames: Iterable[Frame]) -> None:
        """Notes faults the ranks fired themselves, loops that fire their own, and steps;
        fires the step faults now due."""
        for sample in samples:
            rank = _int(sample.labels.get("rank"))
            if sample.name == EVENT_INJECTOR_ARMED and rank is not None:
                self._armed.add(rank)
            elif sample.name == "event.fault":
                self.fired.add(sample.labels.get("spec", ""))
        for frame in frames:
            rank, step = frame.subject.rank, frame.step
            if rank is None or step is None or step <= self._steps.get(rank, -1):
                continue
            self._steps[rank] = step
            for spec in self._due_at_step(rank, step):
                self._fire(spec, step, frame.time)

    def poll(self, now: float) -> None:
        """Fires the faults whose time has come."""
        for spec in self._mine():
            if spec.time is None or now - self._started < spec.time:
                continue
            key = str(spec)
            if spec.kind != "slow":
                if key not in self.fired:
                    self._fire(spec, self._steps.get(spec.rank), now)
            elif self._next_period.get(key, 0.0) <= now and not self._slow_spent(spec):
                self._next_period[key] = now + SLOW_PERIOD_S
                self._fire(spec, self._steps.get(spec.rank), now)

    def unfired(self) -> list[FaultSpec]:
        return [spec for spec in self.specs if str(spec) not in self.fired]

    def close(self) -> None:
        """Ends the duty cycles of slow faults; every rank they hold is continued."""
        self._closing.set()
        with self._lock:
            holds, self._holds = self._holds, []
        for thread in holds:
            thread.join()

    def _mine(self) -> list[FaultSpec]:
        """Faults of the current attempt that the supervisor fires."""
        return [s for s in self.specs if s.outside and s.attempt == self._attempt]

    def _due_at_step(self, rank: int, step: int) -> list[FaultSpec]:
        if rank in self._armed:
            return []
        due = []
        for spec in self._mine():
            if spec.rank != rank or spec.time is not None or step < spec.step:
                continue
            if spec.kind == "slow":
                if not self._slow_spent(spec):
                    due.append(spec)
            elif str(spec) not in self.fired:
                due.append(spec)
        return due

    def _slow_spent(self, spec: FaultSpec) -> bool:
        return spec.steps > 0 and self._slowed.get(str(spec), 0) >= spec.steps

    def _fire(self, spec: FaultSpec, step: int | None, now: float) -> None:
        pid = self.pids().get(spec.rank)
        if pid is None:
            return
        key = str(spec)
        first = key not in self.fired
        self.fired.add(key)
        if spec.kind == "slow":
            self._slowed[key] = self._slowed.get(key, 0) + 1
            self._hold(spec.rank, pid, spec.seconds)
        else:
            self._signal(pid, signal.SIGKILL if spec.kind == "kill" else signal.SIGSTOP)
        if first:
            self.record(FaultFired(spec, step, now, self._attempt))

    def _hold(self, rank: int, pid: int, seconds: float) -> None:
        """Stops the rank for ``seconds``, then continues it (on a thread of its own)."""
        thread = threading.Thread(
            target=self._held, args=(rank, pid, seconds), daemon=True, name="eagleeye-slow"
        )
        with self._lock:
            self._holds = [t for t in self._holds if t.is_alive()] + [thread]
            self._held_ranks[rank] = self._held_ranks.get(rank, 0) + 1
        thread.start()

    def _held(self, rank: int, pid: int, seconds: float) -> None:
        self._signal(pid, signal.SIGSTOP)
        self._closing.wait(seconds)
        with self._lock:
            self._held_ranks[rank] -= 1
            if not self._held_ranks[rank]:
                del self._held_ranks[rank]
            self._signal(pid, signal.SIGCONT)

    def held(self) -> frozenset[int]:
        """Ranks a slow fault holds right now: a slow rank, not a stopped one, so their
        stopped state is no evidence of a hang."""
        with self._lock:
            return frozenset(self._held_ranks)

    def _signal(self, pid: int, sig: int) -> None:
        try:
            self.send(pid, sig)
        except ProcessLookupError:
            pass
        except OSError as exc:
            log.warning("cannot send signal %d to rank process %d: %s", sig, pid, exc)


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None
