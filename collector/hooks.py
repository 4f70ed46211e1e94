"""The in-loop hook: what a training loop calls each step. It never raises, never blocks.

Per step it measures the step time and named sections (data wait, forward, backward,
optimizer, checkpoint), takes the metrics the loop reports (loss, grad norm, learning rate,
tokens) and times the collectives it is told about. At the end of the step everything goes
as one batch into a bounded queue; a background thread sends it. When the queue is full
the batch is dropped and counted, so a slow or absent controller never slows training.

Steps come from the loop (``step_start``/``step_end``) or, in a script that never calls
them, from the zero-code instrumentation (``auto_step_start``/``auto_step_end``, driven by
the optimizer's step hooks); once the loop reports a step itself, the automatic steps stop,
so a step is never counted twice. A pause the loop declares (``with hook.pause("eval")``)
is sent at once: the hang detector does not take it for a hang.

>>> sent = []
>>> hook = TrainingHook(lambda labels, rows: sent.append(rows) or True, {"rank": "0"})
>>> hook.step_start(1)
>>> with hook.section("forward"):
...     pass
>>> hook.step_end(1, loss=2.0)
>>> hook.close()
>>> sorted(row[0] for row in sent[0])
['loss', 'section.forward', 'step_time']
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Row = list[Any]
SendFn = Callable[[Mapping[str, str], Sequence[Row]], bool]
_STOP = object()


class TrainingHook:
    """Per-rank telemetry from inside the training loop.

    Args:
        send: delivers one batch (labels, rows); returns False if it had to drop it.
        labels: labels of every sample of this rank (rank, replica, node, attempt).
        queue_size: batches held before new ones are dropped.
        clock: wall-clock time source, seconds.
        wait_report_s: a collective still open after this long is reported at once as
            ``in_collective`` (seconds waited, with op, group and sequence number), and
            again as 0 when it closes: the hang detector's "joined and waits".
    """

    def __init__(
        self,
        send: SendFn,
        labels: Mapping[str, str],
        queue_size: int = 1024,
        clock: Callable[[], float] = time.time,
        wait_report_s: float = 0.1,
    ) -> None:
        self._send = send
        self.labels = dict(labels)
        self._clock = clock
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._rows: Row = []
        self._step: int | None = None
        self._step_started = 0.0
        self._sequence: dict[str, int] = {}
        self._errors_seen: set[str] = set()
        self.dropped = 0
        self.wait_report_s = wait_report_s
        self._open: dict[int, _OpenCollective] = {}
        self._tokens = itertools.count()
        self._lock = threading.Lock()  # collectives may close on a communication thread
        self._comm = _Busy()
        self._explicit = 0  # collectives the loop times itself (the wrappers stand aside)
        self._pauses: dict[str, int] = {}
        self.loop_steps = False  # the loop reports its own steps
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="eagleeye-hook", daemon=True)
        self._thread.start()

    # ---- the loop's API -------------------------------------------------------------
    def step_start(self, step: int) -> None:
        self.loop_steps = True
        self._begin(step)

    def step_end(self, step: int | None = None, **metrics: float) -> None:
        """Closes the step: records step_time and the given metrics, then enqueues."""
        self.loop_steps = True
        self._end(step, metrics)

    def auto_step_start(self, step: int) -> None:
        """Opens a step found by the zero-code instrumentation, unless the loop reports
        its own steps."""
        if not self.loop_steps:
            self._begin(step)

    def auto_step_end(self, step: int, **metrics: float) -> None:
        """Closes a step found by the zero-code instrumentation, unless the loop reports
        its own steps."""
        if not self.loop_steps:
            self._end(step, metrics)

    @property
    def step(self) -> int | None:
        """The step open now (or last closed); None before the first."""
        return self._step

    def _begin(self, step: int) -> None:
        self._step = step
        self._rows = []
        self._step_started = time.perf_counter()
        with self._lock:
            self._comm.restart(self._step_started)

    def _end(self, step: int | None, metrics: Mapping[str, float]) -> None:
        try:
            now = self._clock()
            step = self._step if step is None else step
            ended = time.perf_counter()
            elapsed = ended - self._step_started
            rows = self._rows
            rows.append(["step_time", elapsed, now, step])
            with self._lock:
                busy = self._comm.take(ended)
            if busy is not None:  # wall time with a collective open (overlaps counted once)
                rows.append(["collective_time", busy, now, step])
            for name, value in metrics.items():
                number = _number(value)
                rows.append([name, number, now, step])
                if not math.isfinite(number):  # NaN/Inf flags: the hard rule's input
                    rows.append([f"nonfinite.{name}", 1.0, now, step])
            self._rows = []
            self._enqueue(rows)
        except Exception as exc:  # the hot path never raises into the loop
            self._note_error(exc)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Times a named part of the step (``data``, ``forward``, ``backward``, ...)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._rows.append(
                [f"section.{name}", time.perf_counter() - started, self._clock(), self._step]
            )

    @contextmanager
    def collective(self, op: str, nbytes: int = 0, group: str = "world") -> Iterator[None]:
        """Times one collective; records enter/exit, op, bytes, group and sequence number.
        The zero-code wrappers stand aside inside it, so it is recorded once."""
        token = self.collective_enter(op, group)
        self._explicit += 1
        try:
            yield
        finally:
            self._explicit -= 1
            self.collective_exit(token, nbytes)

    @property
    def timing_explicitly(self) -> bool:
        """Whether the loop is timing a collective itself right now."""
        return self._explicit > 0

    def collective_enter(self, op: str, group: str = "world") -> int:
        """Opens a collective; returns the token that :meth:`collective_exit` closes."""
        token = next(self._tokens)
        started = time.perf_counter()
        with self._lock:
            seq = self._next_seq(group)
            self._open[token] = _OpenCollective(op, group, seq, started, self._step)
            self._comm.enter(started)
        return token

    def collective_exit(self, token: int, nbytes: int = 0) -> None:
        """Closes an open collective and records it with its duration (from any thread)."""
        try:
            ended = time.perf_counter()
            with self._lock:
                entry = self._open.pop(token)
                self._comm.exit(ended)
            duration = ended - entry.started
            if entry.reported:  # the wait that was reported is over
                self._enqueue([["in_collective", 0.0, self._clock(), entry.step, entry.labels()]])
            extra = {**entry.labels(), "bytes": str(nbytes)}
            self._rows.append(["collective", duration, self._clock(), self._step, extra])
        except Exception as exc:
            self._note_error(exc)

    def record_collective(self, op: str, nbytes: int, group: str, duration: float) -> None:
        """Records one collective that took ``duration`` seconds and ended now."""
        with self._lock:
            seq = self._next_seq(group)
        extra = {"op": op, "group": group, "seq": str(seq), "bytes": str(nbytes)}
        self._rows.append(["collective", duration, self._clock(), self._step, extra])

    def _next_seq(self, group: str) -> int:
        """The group's next collective sequence number, as NCCL's flight recorder counts."""
        seq = self._sequence.get(group, 0)
        self._sequence[group] = seq + 1
        return seq

    # ---- pauses ---------------------------------------------------------------------
    @contextmanager
    def pause(self, name: str) -> Iterator[None]:
        """Declares a pause in training (evaluation, a checkpoint save): no step completes
        while it lasts, and that is no hang."""
        self.begin_pause(name)
        try:
            yield
        finally:
            self.end_pause(name)

    def begin_pause(self, name: str) -> None:
        """Starts a declared pause (sent at once); pauses nest by name."""
        with self._lock:
            first = not self._pauses
            self._pauses[name] = self._pauses.get(name, 0) + 1
        if first:
            self._enqueue([["pause", 1.0, self._clock(), self._step, {"pause": name}]])

    def end_pause(self, name: str) -> None:
        """Ends a declared pause; the end of the last open one is sent at once. Ending a
        pause that is not open does nothing."""
        with self._lock:
            count = self._pauses.get(name, 0)
            if count == 0:
                return
            if count == 1:
                del self._pauses[name]
            else:
                self._pauses[name] = count - 1
            last = not self._pauses
        if last:
            self._enqueue([["pause", 0.0, self._clock(), self._step, {"pause": name}]])

    def end_pauses(self) -> None:
        """Ends every open pause."""
        for name in list(self._pauses):
            while name in self._pauses:
                self.end_pause(name)

    def record(self, name: str, value: float) -> None:
        """Adds a metric to the current step."""
        self._rows.append([name, _number(value), self._clock(), self._step])

    def record_at(self, step: int, name: str, value: float) -> None:
        """Adds a metric of an earlier step (a value read later, without a device sync);
        it goes out with the current step's batch."""
        number = _number(value)
        self._rows.append([name, number, self._clock(), step])
        if not math.isfinite(number):
            self._rows.append([f"nonfinite.{name}", 1.0, self._clock(), step])

    def event(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Sends a one-off event (a checkpoint saved, a fault injected) right away."""
        extra = {k: str(v) for k, v in labels.items()}
        self._enqueue([[name, _number(value), self._clock(), self._step, extra]])

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Waits until everything queued was handed to the transport; True if it was."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.001)
        return not self._queue.unfinished_tasks

    def close(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued and stops the sender; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self.flush(timeout_s)
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    # ---- internals -------------------------------------------------------------------
    def _enqueue(self, rows: Row) -> None:
        try:
            self._queue.put_nowait(rows)
        except queue.Full:
            self.dropped += len(rows)

    def _drain(self) -> None:
        poll_s = max(self.wait_report_s / 4, 0.01)
        while True:
            try:
                batch = self._queue.get(timeout=poll_s)
            except queue.Empty:
                self._report_waits()
                continue
            try:
                if batch is _STOP:
                    return
                if not self._send(self.labels, batch):
                    self.dropped += len(batch)
            except Exception as exc:
                self.dropped += len(batch)
                self._note_error(exc)
            finally:
                self._queue.task_done()
            self._report_waits()

    def _report_waits(self) -> None:
        """Sends, once each, the collectives open for longer than ``wait_report_s``."""
        now = time.perf_counter()
        for entry in list(self._open.values()):
            waited = now - entry.started
            if entry.reported or waited < self.wait_report_s:
                continue
            entry.reported = True
            row = ["in_collective", waited, self._clock(), entry.step, entry.labels()]
            try:
                if not self._send(self.labels, [row]):
                    self.dropped += 1
            except Exception as exc:
                self.dropped += 1
                self._note_error(exc)

    def _note_error(self, exc: Exception) -> None:
        key = f"{type(exc).__name__}: {exc}"
        if key not in self._errors_seen:  # log each distinct error once
            self._errors_seen.add(key)
            log.warning("eagleeye hook error (telemetry dropped, training unaffected): %s", key)


class _Busy:
    """Wall time during which at least one collective was open, per step: asynchronous
    collectives (DDP's buckets) overlap, and their durations must not be summed."""

    def __init__(self) -> None:
        self.open = 0
        self.since = 0.0
        self.total = 0.0
        self.seen = False

    def enter(self, now: float) -> None:
        if self.open == 0:
            self.since = now
        self.open += 1
        self.seen = True

    def exit(self, now: float) -> None:
        self.open = max(self.open - 1, 0)
        if self.open == 0:
            self.total += max(now - self.since, 0.0)

    def restart(self, now: float) -> None:
        """A new step: what is still open counts from now."""
        self.total, self.since, self.seen = 0.0, now, self.open > 0

    def take(self, now: float) -> float | None:
        """The step's busy time (None when no collective was open in it)."""
        if not self.seen:
            return None
        busy = self.total + (now - self.since if self.open else 0.0)
        self.restart(now)
        return busy


@dataclass
class _OpenCollective:
    op: str
    group: str
    seq: int
    started: float
    step: int | None
    reported: bool = False

    def labels(self) -> dict[str, str]:
        return {"op": self.op, "group": self.group, "seq": str(self.seq)}


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
